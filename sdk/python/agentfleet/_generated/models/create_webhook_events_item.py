from enum import StrEnum


class CreateWebhookEventsItem(StrEnum):
    BATCH_COMPLETED = "batch.completed"
    RUN_CANCELLED = "run.cancelled"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_WAITING_FOR_CONFIRMATION = "run.waiting_for_confirmation"
    RUN_WAITING_FOR_INPUT = "run.waiting_for_input"

    def __str__(self) -> str:
        return str(self.value)
