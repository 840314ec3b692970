"""The GIL is released while the library runs (ctypes.CDLL calls): another Python
thread keeps running during a long forward; and two Python threads with a
session each on one shared model compute the single-thread bits."""

import threading
import time

import numpy as np

import gemma4
from conftest import golden, tiny


def long_forward_ids(m):
    """Ids whose forward is one C call of at least 0.25 s on this machine: the
    prompt doubles from 1500 tokens until it is (attention grows with its square)."""
    n = 1500
    while True:
        ids = np.arange(n) % 500
        t = time.perf_counter()
        m.logits(ids)
        if time.perf_counter() - t >= 0.25 or n >= 48000:
            return ids
        n *= 2


def test_gil_is_released_during_a_forward():
    m = gemma4.Model(tiny("31b_like"), threads=1)
    ids = long_forward_ids(m)
    ticks, span = [], {}
    done = threading.Event()

    def work():
        span["t0"] = time.perf_counter()
        m.logits(ids)  # one C call of a few hundred ms
        span["t1"] = time.perf_counter()
        done.set()

    th = threading.Thread(target=work)
    th.start()
    while not done.is_set():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    th.join()
    t0, t1 = span["t0"], span["t1"]
    inside = [t for t in ticks if t0 + 0.02 < t < t1 - 0.02]
    assert t1 - t0 > 0.1, "the forward must be long enough to tell"
    # holding the GIL for the whole call would leave no tick inside it
    assert len(inside) >= 10, f"{len(inside)} ticks of the main thread during a {t1 - t0:.3f} s call"


def test_two_threads_two_sessions_one_model():
    m = gemma4.Model(tiny("e2b_like"), threads=1)
    ids = golden("e2b_like")["input_ids"]
    ref = m.logits(ids)
    out = [None] * 4

    def run(k):
        with m.session(max_context=len(ids), chunk=1 + k) as s:
            out[k] = s.forward(ids, logits="all")

    ts = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(o is not None and np.array_equal(o, ref) for o in out)
