from enum import StrEnum


class ToolKind(StrEnum):
    HTTP = "http"
    MCP = "mcp"

    def __str__(self) -> str:
        return str(self.value)
