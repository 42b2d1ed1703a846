import os
import statistics

from farmd.unpredictable import Unpredictable


def test_draws_cover_their_ranges_evenly():
    draws = Unpredictable()
    floats = [draws.random() for _ in range(20_000)]  # several blocks
    assert all(0.0 <= x < 1.0 for x in floats)
    assert abs(statistics.mean(floats) - 0.5) < 0.02
    assert len(set(floats)) == len(floats)
    dice = [draws.randint(1, 6) for _ in range(12_000)]
    assert set(dice) == {1, 2, 3, 4, 5, 6}
    assert all(abs(dice.count(face) - 2_000) < 300 for face in range(1, 7))
    assert all(0 <= draws.getrandbits(k) < 2 ** k for k in (1, 7, 8, 9, 64, 5000))
    assert draws.getrandbits(0) == 0
    assert len(draws.randbytes(10_000)) == 10_000  # more than a block at once


def test_a_forked_child_draws_its_own():
    draws = Unpredictable()
    draws.random()  # a block is held
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what it draws next goes to the parent
        os.write(write, draws.randbytes(32))
        os._exit(0)
    os.close(write)
    child = os.read(read, 64)
    os.waitpid(pid, 0)
    os.close(read)
    assert len(child) == 32 and child != draws.randbytes(32)
