from enum import StrEnum


class RunStatus(StrEnum):
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    FAILED = "failed"
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_FOR_CONFIRMATION = "waiting_for_confirmation"
    WAITING_FOR_INPUT = "waiting_for_input"
    WAITING_FOR_SLOT = "waiting_for_slot"
    WAITING_FOR_TASKS = "waiting_for_tasks"
    WAITING_FOR_THREAD = "waiting_for_thread"

    def __str__(self) -> str:
        return str(self.value)
