/*
 * test_cluster_spec.c - the cluster spec from flags, from TF_CONFIG JSON
 * (with and without a chief), from the environment and from lists; every
 * error is checked for its status code and a key phrase of its message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cluster/cluster.h"
#include "common/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void expect_err(int rc, int want, const char *phrase) {
    if (rc != want || !strstr(qr_last_error(), phrase))
        fail_msg("rc %d (want %d), message '%s', wanted phrase '%s'", rc, want, qr_last_error(),
                 phrase);
}

/* from_flags must fail with want and phrase, and leave *out NULL. */
static void flags_bad(const char *ps, const char *wk, const char *job, int idx,
                      const char *phrase) {
    qr_cluster *c = (qr_cluster *)1;
    expect_err(qr_cluster_from_flags(&c, ps, wk, job, idx), QR_EINVAL, phrase);
    assert_null(c);
}

static void json_bad(const char *doc, const char *phrase) {
    qr_cluster *c = (qr_cluster *)1;
    int rc = qr_cluster_from_json(&c, doc);
    if (rc != QR_EINVAL || !strstr(qr_last_error(), phrase))
        fail_msg("doc %s: rc %d, message '%s', wanted phrase '%s'", doc, rc, qr_last_error(),
                 phrase);
    assert_null(c);
}

/* ------------------------------------------------------------------------ */

static void test_flags_valid(void **state) {
    qr_cluster *c = NULL;
    assert_int_equal(qr_cluster_from_flags(&c, "ps0:2222,ps1:2222", "w0:2222,w1:2222,w2:2222",
                                           "worker", 2),
                     QR_OK);
    assert_int_equal(qr_cluster_num_ps(c), 2);
    assert_int_equal(qr_cluster_num_workers(c), 3);
    assert_string_equal(qr_cluster_address(c, "ps", 1), "ps1:2222");
    assert_string_equal(qr_cluster_address(c, "worker", 0), "w0:2222");
    assert_string_equal(qr_cluster_address(c, "worker", 2), "w2:2222");
    assert_null(qr_cluster_address(c, "worker", 3));
    assert_null(qr_cluster_address(c, "ps", -1));
    assert_null(qr_cluster_address(c, "chef", 0));
    assert_null(qr_cluster_address(c, NULL, 0));
    assert_string_equal(qr_cluster_job(c), "worker");
    assert_int_equal(qr_cluster_task_index(c), 2);
    qr_cluster_free(c);

    /* ps job, one task each, mixed address forms, blanks around elements. */
    assert_int_equal(qr_cluster_from_flags(&c, " localhost:5000 ",
                                           "[::1]:5001, unix:/tmp/w1.sock ,10.0.0.1:7", "ps", 0),
                     QR_OK);
    assert_int_equal(qr_cluster_num_ps(c), 1);
    assert_int_equal(qr_cluster_num_workers(c), 3);
    assert_string_equal(qr_cluster_address(c, "ps", 0), "localhost:5000");
    assert_string_equal(qr_cluster_address(c, "worker", 0), "[::1]:5001");
    assert_string_equal(qr_cluster_address(c, "worker", 1), "unix:/tmp/w1.sock");
    assert_string_equal(c->job, "ps");
    assert_int_equal(c->task_index, 0);
    qr_cluster_free(c);

    /* No job: a spec that names no task (a tool inspecting the cluster). */
    assert_int_equal(qr_cluster_from_flags(&c, "a:1", "b:1", NULL, 5), QR_OK);
    assert_string_equal(qr_cluster_job(c), "");
    assert_int_equal(qr_cluster_task_index(c), -1);
    qr_cluster_free(c);
    assert_int_equal(qr_cluster_from_flags(&c, "a:1", "b:1", "", 0), QR_OK);
    assert_int_equal(qr_cluster_task_index(c), -1);
    qr_cluster_free(c);
}

static void test_flags_errors(void **state) {
    flags_bad("", "w:1", "worker", 0, "--ps_hosts is empty: a cluster needs at least one ps task");
    flags_bad(NULL, "w:1", "worker", 0, "--ps_hosts is empty");
    flags_bad("  ", "w:1", "worker", 0, "--ps_hosts is empty");
    flags_bad("p:1", "", "worker", 0,
              "--worker_hosts is empty: a cluster needs at least one worker task");
    flags_bad("p:1", "a:1,,b:1", "worker", 0, "--worker_hosts: address 2 is empty");
    flags_bad("p:1", "a:1,b:1,", "worker", 0, "--worker_hosts: address 3 is empty");
    flags_bad("p:1", "a:1, ,b:1", "worker", 0, "--worker_hosts: address 2 is empty");
    flags_bad(",p:1", "a:1", "worker", 0, "--ps_hosts: address 1 is empty");
    flags_bad("p:1,q", "a:1", "worker", 0, "--ps_hosts: address 2: 'q': missing port");
    flags_bad("p:1", "a:0", "worker", 0, "--worker_hosts: address 1: 'a:0': port 0 is out of range");
    flags_bad("p:1", "a:70000", "worker", 0, "port 70000 is out of range 1..65535");
    flags_bad("p:1", "a:x1", "worker", 0, "port 'x1' is not a number");
    flags_bad("p:1", ":80", "worker", 0, "empty host");
    flags_bad("p!:1", "a:1", "worker", 0, "bad character '!' in host");
    flags_bad("p:1", "::1:80", "worker", 0, "must be in brackets");

    /* Duplicates anywhere in the cluster, including different spellings. */
    flags_bad("h:1,h:2", "h:1", "worker", 0,
              "duplicate address: ps 0 and worker 0 are both tcp:h:1");
    flags_bad("h:1,h:1", "w:1", "ps", 0, "ps 0 and ps 1");
    flags_bad("p:1", "w:1,x:1,w:1", "ps", 0, "worker 0 and worker 2");
    flags_bad("[::1]:5", "[0::1]:5", "ps", 0, "duplicate address");
    flags_bad("Host:5", "host:5", "ps", 0, "duplicate address");
    flags_bad("unix:/s", "unix:/s", "ps", 0, "duplicate address");

    flags_bad("p:1", "a:1,b:1", "chef", 0, "unknown job name 'chef': expected ps or worker");
    flags_bad("p:1", "a:1,b:1", "worker", 3,
              "--task_index 3 is out of range: job worker has 2 tasks (0..1)");
    flags_bad("p:1", "a:1,b:1", "worker", -1, "--task_index -1 is out of range");
    flags_bad("p:1", "a:1,b:1", "ps", 1,
              "--task_index 1 is out of range: job ps has 1 task (0..0)");

    expect_err(qr_cluster_from_flags(NULL, "p:1", "w:1", "ps", 0), QR_EINVAL, "NULL");
}

/* ------------------------------------------------------------------------ */

static void test_json_valid(void **state) {
    qr_cluster *c = NULL;
    assert_int_equal(qr_cluster_from_json(&c, "{\"cluster\":{\"ps\":[\"p0:1\",\"p1:1\"],"
                                              "\"worker\":[\"w0:1\",\"w1:1\"]},"
                                              "\"task\":{\"type\":\"worker\",\"index\":1}}"),
                     QR_OK);
    assert_int_equal(qr_cluster_num_ps(c), 2);
    assert_int_equal(qr_cluster_num_workers(c), 2);
    assert_string_equal(qr_cluster_address(c, "ps", 1), "p1:1");
    assert_string_equal(qr_cluster_address(c, "worker", 1), "w1:1");
    assert_string_equal(qr_cluster_job(c), "worker");
    assert_int_equal(qr_cluster_task_index(c), 1);
    qr_cluster_free(c);

    /* ps task; TensorFlow's other top-level keys are ignored; so is an
     * evaluator job in the cluster. */
    assert_int_equal(qr_cluster_from_json(&c, "{\"cluster\":{\"ps\":[\"p0:1\"],"
                                              "\"worker\":[\"w0:1\"],\"evaluator\":[\"e:1\"]},"
                                              "\"task\":{\"type\":\"ps\",\"index\":0},"
                                              "\"environment\":\"cloud\",\"rpc_layer\":\"grpc\"}"),
                     QR_OK);
    assert_string_equal(qr_cluster_job(c), "ps");
    assert_int_equal(qr_cluster_task_index(c), 0);
    assert_int_equal(qr_cluster_num_workers(c), 1);
    qr_cluster_free(c);

    /* Missing index defaults to 0, as in TensorFlow. */
    assert_int_equal(qr_cluster_from_json(&c, "{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":[\"w:1\"]},"
                                              "\"task\":{\"type\":\"worker\"}}"),
                     QR_OK);
    assert_int_equal(qr_cluster_task_index(c), 0);
    qr_cluster_free(c);

    /* No task, or an empty one: the spec names no task. */
    assert_int_equal(qr_cluster_from_json(&c, "{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":[\"w:1\"]}}"),
                     QR_OK);
    assert_string_equal(qr_cluster_job(c), "");
    assert_int_equal(qr_cluster_task_index(c), -1);
    qr_cluster_free(c);
    assert_int_equal(qr_cluster_from_json(&c, "{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":[\"w:1\"]},"
                                              "\"task\":{}}"),
                     QR_OK);
    assert_int_equal(qr_cluster_task_index(c), -1);
    qr_cluster_free(c);

    /* Whitespace and newlines, as a pretty-printed TF_CONFIG has. */
    assert_int_equal(qr_cluster_from_json(&c, "\n{ \"task\": {\"index\": 0, \"type\": \"ps\"},\n"
                                              "  \"cluster\": {\"worker\": [\"w:1\"],\n"
                                              "               \"ps\": [\"unix:/tmp/p.sock\"]} }\n"),
                     QR_OK);
    assert_string_equal(qr_cluster_address(c, "ps", 0), "unix:/tmp/p.sock");
    qr_cluster_free(c);
}

static void test_json_chief(void **state) {
    const char *cluster = "{\"cluster\":{\"chief\":[\"c:1\"],\"ps\":[\"p:1\"],"
                          "\"worker\":[\"w0:1\",\"w1:1\"]},";
    char doc[512];
    qr_cluster *c = NULL;

    snprintf(doc, sizeof doc, "%s\"task\":{\"type\":\"chief\",\"index\":0}}", cluster);
    assert_int_equal(qr_cluster_from_json(&c, doc), QR_OK);
    assert_int_equal(qr_cluster_num_workers(c), 3);
    assert_string_equal(qr_cluster_address(c, "worker", 0), "c:1");
    assert_string_equal(qr_cluster_address(c, "worker", 1), "w0:1");
    assert_string_equal(qr_cluster_address(c, "worker", 2), "w1:1");
    assert_string_equal(qr_cluster_job(c), "worker");
    assert_int_equal(qr_cluster_task_index(c), 0);
    qr_cluster_free(c);

    snprintf(doc, sizeof doc, "%s\"task\":{\"type\":\"worker\",\"index\":1}}", cluster);
    assert_int_equal(qr_cluster_from_json(&c, doc), QR_OK);
    assert_string_equal(qr_cluster_job(c), "worker");
    assert_int_equal(qr_cluster_task_index(c), 2); /* worker 1 -> worker 2 */
    qr_cluster_free(c);

    /* Chief alone, no worker list. */
    assert_int_equal(qr_cluster_from_json(&c, "{\"cluster\":{\"chief\":[\"c:1\"],\"ps\":[\"p:1\"]},"
                                              "\"task\":{\"type\":\"chief\"}}"),
                     QR_OK);
    assert_int_equal(qr_cluster_num_workers(c), 1);
    assert_int_equal(qr_cluster_task_index(c), 0);
    qr_cluster_free(c);

    snprintf(doc, sizeof doc, "%s\"task\":{\"type\":\"worker\",\"index\":2}}", cluster);
    json_bad(doc, "task.index 2 is out of range: job worker has 2 tasks (0..1)");
    snprintf(doc, sizeof doc, "%s\"task\":{\"type\":\"chief\",\"index\":1}}", cluster);
    json_bad(doc, "task.index 1 is out of range: job chief has 1 task (0..0)");
    json_bad("{\"cluster\":{\"chief\":[\"c:1\",\"d:1\"],\"ps\":[\"p:1\"]}}",
             "cluster.chief must have exactly one address, has 2");
    json_bad("{\"cluster\":{\"chief\":[],\"ps\":[\"p:1\"],\"worker\":[\"w:1\"]}}",
             "cluster.chief must have exactly one address, has 0");
    json_bad("{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":[\"w:1\"]},\"task\":{\"type\":\"chief\"}}",
             "no chief job");
    json_bad("{\"cluster\":{\"chief\":[\"c:1\"],\"ps\":[\"p:1\"]},\"task\":{\"type\":\"worker\"}}",
             "no worker job");
    /* Address errors name the JSON path, chief included. */
    json_bad("{\"cluster\":{\"chief\":[\"c\"],\"ps\":[\"p:1\"],\"worker\":[\"w:1\"]}}",
             "cluster.chief[0]: 'c': missing port");
    json_bad("{\"cluster\":{\"chief\":[\"c:1\"],\"ps\":[\"p:1\"],\"worker\":[\"w:1\",\"w:0\"]}}",
             "cluster.worker[1]: 'w:0': port 0");
    json_bad("{\"cluster\":{\"chief\":[\"c:1\"],\"ps\":[\"p:1\"],\"worker\":[\"c:1\"]}}",
             "worker 0 and worker 1 are both tcp:c:1");
}

static void test_json_errors(void **state) {
    /* Malformed JSON: position and snippet. */
    json_bad("{\"cluster\": {\"ps\": [\"p:1\",]}}", "not valid JSON");
    json_bad("{\"cluster\": {\"ps\": [\"p:1\",]}}", "line 1 column 27 near ']}}'");
    json_bad("{\n\"cluster\": \n  {oops}}", "error at line 3 column");
    json_bad("{\"cluster\": {", "unexpected end of input");
    json_bad("", "not valid JSON");
    json_bad("{} trailing", "near 'trailing'");

    json_bad("[1,2]", "TF_CONFIG: must be a JSON object, got an array");
    json_bad("{}", "no \"cluster\" object");
    json_bad("{\"cluster\":[]}", "\"cluster\" must be an object, got an array");
    json_bad("{\"cluster\":{\"worker\":[\"w:1\"]}}", "no ps job: a cluster needs at least one ps task");
    json_bad("{\"cluster\":{\"ps\":[\"p:1\"]}}", "no worker or chief job");
    json_bad("{\"cluster\":{\"ps\":[],\"worker\":[\"w:1\"]}}",
             "cluster.ps is empty: a cluster needs at least one ps task");
    json_bad("{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":[]}}", "cluster.worker is empty");
    json_bad("{\"cluster\":{\"ps\":\"p:1\",\"worker\":[\"w:1\"]}}",
             "cluster.ps must be an array of address strings, got a string");
    json_bad("{\"cluster\":{\"ps\":[\"p:1\",2],\"worker\":[\"w:1\"]}}",
             "cluster.ps[1] must be an address string, got a number");
    json_bad("{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":{\"0\":\"w:1\"}}}",
             "cluster.worker must be an array of address strings, got an object");
    json_bad("{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":[\"w:1\"],\"master\":[\"m:1\"]}}",
             "unknown job 'master'");
    json_bad("{\"cluster\":{\"ps\":[\"p:1\"],\"ps\":[\"q:1\"],\"worker\":[\"w:1\"]}}",
             "job 'ps' appears twice");
    json_bad("{\"cluster\":{\"ps\":[\"\"],\"worker\":[\"w:1\"]}}", "cluster.ps[0] is empty");
    json_bad("{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":[\"w:1\",\"p:1\"]}}",
             "duplicate address: ps 0 and worker 1");

    const char *cl = "{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":[\"w0:1\",\"w1:1\"]},";
    char doc[512];
#define TASK(t) (snprintf(doc, sizeof doc, "%s\"task\":%s}", cl, t), doc)
    json_bad(TASK("{\"type\":\"worker\",\"index\":\"1\"}"),
             "task.index must be an integer, got a string");
    json_bad(TASK("{\"type\":\"worker\",\"index\":1.5}"), "task.index must be an integer, got 1.5");
    json_bad(TASK("{\"type\":\"worker\",\"index\":1e12}"), "task.index must be an integer");
    json_bad(TASK("{\"type\":\"worker\",\"index\":-1}"), "task.index -1 is out of range");
    json_bad(TASK("{\"type\":\"worker\",\"index\":2}"),
             "task.index 2 is out of range: job worker has 2 tasks (0..1)");
    json_bad(TASK("{\"type\":\"ps\",\"index\":1}"), "job ps has 1 task (0..0)");
    json_bad(TASK("{\"type\":\"chef\",\"index\":0}"), "unknown task.type 'chef'");
    json_bad(TASK("{\"type\":\"evaluator\",\"index\":0}"), "'evaluator' is not supported");
    json_bad(TASK("{\"type\":3}"), "task.type must be a string, got a number");
    json_bad(TASK("{\"index\":0}"), "task.type is missing");
    json_bad(TASK("\"worker\""), "\"task\" must be an object, got a string");
#undef TASK

    qr_cluster *c = (qr_cluster *)1;
    expect_err(qr_cluster_from_json(&c, NULL), QR_EINVAL, "NULL");
    assert_null(c);
}

static void test_env(void **state) {
    qr_cluster *c = (qr_cluster *)1;
    unsetenv("TF_CONFIG");
    expect_err(qr_cluster_from_env(&c), QR_ENOTFOUND, "TF_CONFIG is not set");
    assert_null(c);
    setenv("TF_CONFIG", " ", 1);
    expect_err(qr_cluster_from_env(&c), QR_ENOTFOUND, "TF_CONFIG is set but empty");

    setenv("TF_CONFIG",
           "{\"cluster\":{\"ps\":[\"p:1\"],\"worker\":[\"w0:1\",\"w1:1\"]},"
           "\"task\":{\"type\":\"worker\",\"index\":1}}",
           1);
    assert_int_equal(qr_cluster_from_env(&c), QR_OK);
    assert_string_equal(qr_cluster_job(c), "worker");
    assert_int_equal(qr_cluster_task_index(c), 1);
    assert_string_equal(qr_cluster_address(c, "worker", 1), "w1:1");
    qr_cluster_free(c);

    setenv("TF_CONFIG", "{\"cluster\":", 1);
    expect_err(qr_cluster_from_env(&c), QR_EINVAL, "TF_CONFIG: not valid JSON");
    assert_null(c);
    unsetenv("TF_CONFIG");
}

/* ------------------------------------------------------------------------ */

static void test_create_and_clone(void **state) {
    const char *ps[] = {"localhost:6000", "localhost:6001"};
    const char *wk[] = {"localhost:6002", "unix:/tmp/w1.sock"};
    qr_cluster *c = NULL, *d = NULL;
    assert_int_equal(qr_cluster_create(&c, 2, ps, 2, wk, "ps", 1), QR_OK);
    assert_string_equal(qr_cluster_job(c), "ps");
    assert_int_equal(qr_cluster_task_index(c), 1);

    assert_int_equal(qr_cluster_clone(c, &d), QR_OK);
    qr_cluster_free(c); /* the clone owns its own strings */
    assert_int_equal(d->nps, 2);
    assert_int_equal(d->nworkers, 2);
    assert_string_equal(d->ps[0], "localhost:6000");
    assert_string_equal(d->workers[1], "unix:/tmp/w1.sock");
    assert_string_equal(d->job, "ps");
    assert_int_equal(d->task_index, 1);
    qr_cluster_free(d);

    /* No task. */
    assert_int_equal(qr_cluster_create(&c, 2, ps, 2, wk, NULL, 7), QR_OK);
    assert_string_equal(c->job, "");
    assert_int_equal(c->task_index, -1);
    qr_cluster_free(c);

    c = (qr_cluster *)1;
    expect_err(qr_cluster_create(&c, 0, ps, 2, wk, "ps", 0), QR_EINVAL,
               "the ps list is empty: a cluster needs at least one ps task");
    assert_null(c);
    expect_err(qr_cluster_create(&c, 2, ps, 0, wk, "ps", 0), QR_EINVAL, "the worker list is empty");
    const char *dup[] = {"localhost:6000"};
    expect_err(qr_cluster_create(&c, 2, ps, 1, dup, "ps", 0), QR_EINVAL,
               "ps 0 and worker 0 are both");
    const char *bad[] = {"localhost:6003", "nope"};
    expect_err(qr_cluster_create(&c, 2, ps, 2, bad, "ps", 0), QR_EINVAL,
               "worker 1: 'nope': missing port");
    const char *empty[] = {NULL};
    expect_err(qr_cluster_create(&c, 2, ps, 1, empty, "ps", 0), QR_EINVAL, "worker 0 is empty");
    expect_err(qr_cluster_create(&c, 2, ps, 2, wk, "worker", 2), QR_EINVAL,
               "task_index 2 is out of range: job worker has 2 tasks (0..1)");
    expect_err(qr_cluster_create(&c, 2, ps, 2, wk, "chief", 0), QR_EINVAL, "unknown job name");
    assert_null(c);

    expect_err(qr_cluster_clone(NULL, &d), QR_EINVAL, "NULL cluster");
    assert_null(d);
}

static void test_null_handles(void **state) {
    qr_cluster_free(NULL);
    assert_int_equal(qr_cluster_num_ps(NULL), 0);
    assert_int_equal(qr_cluster_num_workers(NULL), 0);
    assert_null(qr_cluster_address(NULL, "ps", 0));
    assert_string_equal(qr_cluster_job(NULL), "");
    assert_int_equal(qr_cluster_task_index(NULL), -1);
}

/* A larger cluster: every address kept in order, no false duplicates. */
static void test_many_tasks(void **state) {
    char ps[4096] = "", wk[8192] = "";
    for (int i = 0; i < 50; i++)
        snprintf(ps + strlen(ps), sizeof ps - strlen(ps), "%sps%d.example:%d", i ? "," : "", i,
                 2000 + i);
    for (int i = 0; i < 200; i++)
        snprintf(wk + strlen(wk), sizeof wk - strlen(wk), "%s127.0.0.1:%d", i ? "," : "",
                 3000 + i);
    qr_cluster *c = NULL;
    assert_int_equal(qr_cluster_from_flags(&c, ps, wk, "worker", 199), QR_OK);
    assert_int_equal(qr_cluster_num_ps(c), 50);
    assert_int_equal(qr_cluster_num_workers(c), 200);
    assert_string_equal(qr_cluster_address(c, "ps", 49), "ps49.example:2049");
    assert_string_equal(qr_cluster_address(c, "worker", 199), "127.0.0.1:3199");
    qr_cluster_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flags_valid),      cmocka_unit_test(test_flags_errors),
        cmocka_unit_test(test_json_valid),       cmocka_unit_test(test_json_chief),
        cmocka_unit_test(test_json_errors),      cmocka_unit_test(test_env),
        cmocka_unit_test(test_create_and_clone), cmocka_unit_test(test_null_handles),
        cmocka_unit_test(test_many_tasks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
