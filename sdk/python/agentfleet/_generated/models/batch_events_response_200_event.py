from enum import StrEnum


class BatchEventsResponse200Event(StrEnum):
    BATCH_COMPLETED = "batch_completed"
    PROGRESS = "progress"

    def __str__(self) -> str:
        return str(self.value)
