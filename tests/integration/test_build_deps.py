"""test_build_deps.py - configuring quorum where the C libraries are missing
(what `pip install .` meets on a fresh machine) names every missing one at
once, with the Debian packages in one `sudo apt-get install` command and
scripts/setup.sh: pkg-config pointed at an empty directory (nothing
found), as a plain build (cmocka too, for the tests) and as pip's
(-DSKBUILD=ON: no tests, no cmocka); and with no pkg-config at all.
Usage: test_build_deps.py QUORUM_BINARY CMAKE SOURCE_DIR"""

import os
import shutil
import sys
import tempfile

from qrtest import Proc

cmake, source = sys.argv[2], sys.argv[3]

LIBRARIES = {"libuv": "libuv1-dev", "libcjson": "libcjson-dev", "openblas": "libopenblas-dev",
             "zlib": "zlib1g-dev", "libmicrohttpd": "libmicrohttpd-dev",
             "libsodium": "libsodium-dev", "lmdb": "liblmdb-dev"}


def configure(*args):
    """cmake's output (one paragraph per line) and exit status, configuring
    into a fresh directory with pkg-config finding nothing."""
    build = tempfile.mkdtemp(prefix="qr-deps-")
    empty = tempfile.mkdtemp(prefix="qr-pc-")
    env = dict(os.environ, PKG_CONFIG_LIBDIR=empty, PKG_CONFIG_PATH="")
    try:
        rc, out, err = Proc([cmake, "-S", source, "-B", build] + list(args), env=env).wait(300)
    finally:
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(empty, ignore_errors=True)
    return rc, " ".join((out + err).split())  # cmake wraps its messages


def check(text, packages):
    command = "sudo apt-get install " + " ".join(packages)
    assert command in text, (command, text[-3000:])
    assert "scripts/setup.sh" in text, text[-3000:]
    assert text.count("CMake Error") == 1, text[-3000:]  # once, with them all


rc, text = configure()
assert rc != 0, text[-3000:]
for module in list(LIBRARIES) + ["cmocka"]:
    assert module in text, (module, text[-3000:])
check(text, list(LIBRARIES.values()) + ["libcmocka-dev"])
print("ok: a plain build names all eight libraries (cmocka for the tests) at once")

rc, text = configure("-DSKBUILD=ON")
assert rc != 0, text[-3000:]
for module in LIBRARIES:
    assert module in text, (module, text[-3000:])
assert "cmocka" not in text, text[-3000:]
check(text, list(LIBRARIES.values()))
print("ok: pip's build (SKBUILD) names all seven libraries at once")

rc, text = configure("-DSKBUILD=ON", "-DPKG_CONFIG_EXECUTABLE=/nonexistent/pkg-config")
assert rc != 0, text[-3000:]
assert "pkg-config is missing" in text, text[-3000:]
check(text, ["pkg-config"] + list(LIBRARIES.values()))
print("ok: without pkg-config, it is named first, with the seven libraries")
print("PASS: missing C libraries are named at once, with the command that installs them")
