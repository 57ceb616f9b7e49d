from collections.abc import Callable

C_TAIL: int
C_WRITTEN: int
C_HEAD: int
S_SLEEPING: int
WAKE_FILL_SHIFT: int
HEADER_SIZE: int

class Writer:
    tail: int
    tag: int
    limit: int
    written: int
    insane_head: int
    def __init__(
        self,
        data: memoryview,
        control: memoryview,
        status: memoryview,
        capacity: int,
        wake: Callable[[], None],
        report: Callable[[str], None],
    ) -> None: ...
    def write(self, rtype: int, payload: bytes, /) -> bool: ...
    def set_slow(self, slow: Callable[[int, bytes], str | bool], /) -> None: ...
    def set_reentered(self, reentered: Callable[[bytes], bool], /) -> None: ...
