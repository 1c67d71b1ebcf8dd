from enum import StrEnum


class AgentMode(StrEnum):
    PLAN_AND_SOLVE = "plan_and_solve"
    REACT = "react"

    def __str__(self) -> str:
        return str(self.value)
