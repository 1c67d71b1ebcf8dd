from enum import StrEnum


class IfBusy(StrEnum):
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"
    REJECT = "reject"

    def __str__(self) -> str:
        return str(self.value)
