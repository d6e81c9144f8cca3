"""proxy/cache/memory.py: freed heap pages go back to the operating system."""

from __future__ import annotations

from pathlib import Path

from proxy.cache import memory


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_freed_objects_pages_are_given_back() -> None:
    # malloc_trim is glibc's: the image and CI run on Debian's. On another libc this fails,
    # which is what a build there should learn (memory would not be handed back).
    # Objects of a stored ConfigMap's size come from malloc; keeping every 64th pins the heap's
    # top, so malloc cannot shrink it by itself: only trimming returns the free pages between.
    objects = [bytes(1300) + i.to_bytes(4, "little") for i in range(40_000)]
    kept = objects[::64]
    del objects
    before = _rss()
    memory.give_back()
    after = _rss()
    assert before - after > 20 * 1024 * 1024, (before, after)
    assert len(kept) == 625


def test_give_back_can_be_called_any_time() -> None:
    memory.give_back()
    memory.give_back()
