from enum import StrEnum


class ThreadEventsResponse200Event(StrEnum):
    CONFIRMATION_REQUIRED = "confirmation_required"
    CONTEXT_COMPACTED = "context_compacted"
    INPUT_REQUIRED = "input_required"
    ITERATION_STARTED = "iteration_started"
    MESSAGE_COMPLETED = "message_completed"
    MESSAGE_DELTA = "message_delta"
    PLAN_CREATED = "plan_created"
    ROUND_COMPLETED = "round_completed"
    RUN_CANCELLED = "run_cancelled"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    RUN_QUEUED = "run_queued"
    RUN_RECOVERED = "run_recovered"
    RUN_RESUMED = "run_resumed"
    RUN_STARTED = "run_started"
    STREAM_REBUILT = "stream_rebuilt"
    TASK_COMPLETED = "task_completed"
    TOOL_COMPLETED = "tool_completed"
    TOOL_STARTED = "tool_started"

    def __str__(self) -> str:
        return str(self.value)
