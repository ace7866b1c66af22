"""Build-time check of sbgemm.c (arm64 CPU stand-in): its products equal numpy's float64 ones on
the same bfloat16 values, for each transpose and with beta 0 and 1; then vllm._C, which needs it,
loads."""

import ctypes
import sys

import numpy as np

lib = ctypes.CDLL(sys.argv[1])
rng = np.random.default_rng(0)
i32, f32 = ctypes.c_int, ctypes.c_float


def bf16(x):
    """x rounded down to bfloat16: (the 16-bit values, the floats they stand for)."""
    h = (np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return h, (h.astype(np.uint32) << 16).view(np.float32)


m, n, k = 7, 5, 3
for ta in "NT":
    for tb in "NT":
        for beta in (0.0, 1.0):
            a16, a = bf16(rng.standard_normal((m, k) if ta == "N" else (k, m)))
            b16, b = bf16(rng.standard_normal((k, n) if tb == "N" else (n, k)))
            c = np.asfortranarray(rng.standard_normal((m, n)).astype(np.float32))
            # The reference in float64 (bfloat16 values are exact there): under qemu 10's default
            # CPU (SVE2) numpy's float32 matmul is wrong (its OpenBLAS 0.3.30 picks SVE kernels;
            # measured off by up to 5.7e24 against plain loops, float64 exact; right with
            # QEMU_CPU=neoverse-n1), and a build runs on that default CPU.
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            want = 0.5 * ((a64 if ta == "N" else a64.T) @ (b64 if tb == "N" else b64.T)) + beta * c
            a16, b16 = np.asfortranarray(a16), np.asfortranarray(b16)
            args = [ctypes.c_char_p(ta.encode()), ctypes.c_char_p(tb.encode()), i32(m), i32(n), i32(k), f32(0.5)]
            lib.sbgemm_(
                *[ctypes.byref(x) if not isinstance(x, ctypes.c_char_p) else x for x in args],
                a16.ctypes.data_as(ctypes.c_void_p), ctypes.byref(i32(a16.shape[0])),
                b16.ctypes.data_as(ctypes.c_void_p), ctypes.byref(i32(b16.shape[0])),
                ctypes.byref(f32(beta)), c.ctypes.data_as(ctypes.c_void_p), ctypes.byref(i32(m)),
            )  # fmt: skip
            assert np.allclose(c, want, rtol=1e-5, atol=1e-5), (ta, tb, beta, np.abs(c - want).max())

import torch  # noqa: E402,F401  vllm._C links against torch's libraries
import vllm._C  # noqa: E402,F401

print("sbgemm_: 8 products equal numpy's float64 ones; vllm._C loads")
