from enum import StrEnum


class BatchStatus(StrEnum):
    CANCELLED = "cancelled"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    CREATING = "creating"
    IN_PROGRESS = "in_progress"

    def __str__(self) -> str:
        return str(self.value)
