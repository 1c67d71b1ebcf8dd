from enum import StrEnum


class ResultsFilter(StrEnum):
    FINISHED = "finished"

    def __str__(self) -> str:
        return str(self.value)
