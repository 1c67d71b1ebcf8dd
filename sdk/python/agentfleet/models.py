"""The API's schemas as classes, generated from its OpenAPI document (``Run``, ``Batch``,
``RunStatus``, …): what the client's calls return."""

from ._generated.models import *  # noqa: F401,F403
from ._generated.models import __all__  # noqa: F401
