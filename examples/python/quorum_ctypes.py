"""quorum_ctypes.py - a thin Python binding of libquorum with ctypes.

The C API is built for this: opaque handles are c_void_p, arrays are
pointers, every call returns a status and qr_last_error() says why. This
module wraps the basic path (config, cluster, ps, worker) and raises
QuorumError with the library's message on any failure.
"""

import ctypes
import threading

c_int, c_int64, c_uint64, c_float = ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_float
c_char_p, c_void_p, POINTER = ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER


class QuorumError(RuntimeError):
    def __init__(self, status, name, message):
        super().__init__("%s: %s" % (name, message))
        self.status = status


class Library:
    def __init__(self, path):
        lib = ctypes.CDLL(path)
        sig = {
            "qr_last_error": (c_char_p, []),
            "qr_status_name": (c_char_p, [c_int]),
            "qr_version": (c_char_p, []),
            "qr_config_new": (c_int, [POINTER(c_void_p)]),
            "qr_config_set": (c_int, [c_void_p, c_char_p, c_char_p]),
            "qr_config_free": (None, [c_void_p]),
            "qr_cluster_from_flags": (c_int, [POINTER(c_void_p), c_char_p, c_char_p, c_char_p, c_int]),
            "qr_cluster_free": (None, [c_void_p]),
            "qr_ps_create": (c_int, [POINTER(c_void_p), c_void_p, c_void_p]),
            "qr_ps_run": (c_int, [c_void_p]),
            "qr_ps_stop": (c_int, [c_void_p]),
            "qr_ps_free": (None, [c_void_p]),
            "qr_worker_create": (c_int, [POINTER(c_void_p), c_void_p, c_int, c_void_p]),
            "qr_worker_free": (None, [c_void_p]),
            "qr_worker_declare": (c_int, [c_void_p, c_char_p, c_int, POINTER(c_int64), c_char_p,
                                          c_uint64, c_float, POINTER(c_int)]),
            "qr_worker_initialize": (c_int, [c_void_p]),
            "qr_worker_var_size": (c_int64, [c_void_p, c_int]),
            "qr_worker_pull": (c_int, [c_void_p, c_int, POINTER(c_int), POINTER(POINTER(c_float))]),
            "qr_worker_push": (c_int, [c_void_p, c_int, POINTER(c_int), POINTER(POINTER(c_float)),
                                       ctypes.c_uint, POINTER(c_int64)]),
            "qr_worker_stop_cluster": (c_int, [c_void_p]),
        }
        for name, (restype, argtypes) in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        self.lib = lib

    def check(self, status):
        if status != 0:
            raise QuorumError(status, self.lib.qr_status_name(status).decode(),
                              self.lib.qr_last_error().decode())


class Config:
    def __init__(self, q, **options):
        self.q, self.handle = q, c_void_p()
        q.check(q.lib.qr_config_new(ctypes.byref(self.handle)))
        for key, value in options.items():
            self.set(key.replace("_", "-"), value)

    def set(self, key, value):
        self.q.check(self.q.lib.qr_config_set(self.handle, key.encode(), str(value).encode()))

    def close(self):
        self.q.lib.qr_config_free(self.handle)


def cluster(q, ps_hosts, worker_hosts, job, index):
    handle = c_void_p()
    q.check(q.lib.qr_cluster_from_flags(ctypes.byref(handle), ps_hosts.encode(),
                                        worker_hosts.encode(), job.encode(), index))
    return handle


class PS:
    """A ps task served on a Python thread (ctypes releases the GIL)."""

    def __init__(self, q, spec, config):
        self.q, self.handle = q, c_void_p()
        q.check(q.lib.qr_ps_create(ctypes.byref(self.handle), spec, config.handle))
        self.thread = threading.Thread(target=q.lib.qr_ps_run, args=(self.handle,))
        self.thread.start()

    def join(self):
        self.thread.join()
        self.q.lib.qr_ps_free(self.handle)


class Worker:
    def __init__(self, q, spec, config):
        self.q, self.handle, self.sizes = q, c_void_p(), {}
        q.check(q.lib.qr_worker_create(ctypes.byref(self.handle), spec, -1, config.handle))

    def declare(self, name, shape, init="zeros", seed=0, lr=-1.0):
        dims = (c_int64 * len(shape))(*shape)
        var_id = c_int()
        self.q.check(self.q.lib.qr_worker_declare(self.handle, name.encode(), len(shape), dims,
                                                  init.encode(), seed, lr, ctypes.byref(var_id)))
        self.sizes[var_id.value] = self.q.lib.qr_worker_var_size(self.handle, var_id.value)
        return var_id.value

    def initialize(self):
        self.q.check(self.q.lib.qr_worker_initialize(self.handle))

    def pull(self, ids, outs):
        """outs: writable float32 buffers (numpy arrays), one per id."""
        n = len(ids)
        id_arr = (c_int * n)(*ids)
        ptrs = (POINTER(c_float) * n)(*[o.ctypes.data_as(POINTER(c_float)) for o in outs])
        self.q.check(self.q.lib.qr_worker_pull(self.handle, n, id_arr, ptrs))

    def push(self, ids, grads, step=True):
        n = len(ids)
        id_arr = (c_int * n)(*ids)
        ptrs = (POINTER(c_float) * n)(*[g.ctypes.data_as(POINTER(c_float)) for g in grads])
        global_step = c_int64()
        self.q.check(self.q.lib.qr_worker_push(self.handle, n, id_arr, ptrs, 1 if step else 0,
                                               ctypes.byref(global_step)))
        return global_step.value

    def stop_cluster(self):
        self.q.check(self.q.lib.qr_worker_stop_cluster(self.handle))

    def close(self):
        self.q.lib.qr_worker_free(self.handle)
