"""Contains all the data models used in inputs/outputs"""

from .agent_mode import AgentMode
from .agent_spec import AgentSpec
from .batch import Batch
from .batch_counts import BatchCounts
from .batch_created import BatchCreated
from .batch_events_response_200 import BatchEventsResponse200
from .batch_events_response_200_event import BatchEventsResponse200Event
from .batch_item import BatchItem
from .batch_metadata import BatchMetadata
from .batch_page import BatchPage
from .batch_status import BatchStatus
from .batch_usage import BatchUsage
from .create_batch import CreateBatch
from .create_key import CreateKey
from .create_mcp_server import CreateMcpServer
from .create_run import CreateRun
from .create_tenant import CreateTenant
from .create_webhook import CreateWebhook
from .create_webhook_events_item import CreateWebhookEventsItem
from .created_key import CreatedKey
from .decision_body import DecisionBody
from .delivery_info import DeliveryInfo
from .delivery_page import DeliveryPage
from .endpoint import Endpoint
from .erasure import Erasure
from .erasure_counted_type_0 import ErasureCountedType0
from .erasure_deleted import ErasureDeleted
from .erasure_remaining_type_0 import ErasureRemainingType0
from .error_body import ErrorBody
from .error_detail import ErrorDetail
from .event_envelope import EventEnvelope
from .event_envelope_type import EventEnvelopeType
from .header_body import HeaderBody
from .health import Health
from .if_busy import IfBusy
from .json_object import JsonObject
from .key_info import KeyInfo
from .key_list import KeyList
from .mcp_server import McpServer
from .mcp_server_list import McpServerList
from .message import Message
from .message_body import MessageBody
from .message_page import MessagePage
from .openapi_response_200 import OpenapiResponse200
from .plan_round import PlanRound
from .plan_spec import PlanSpec
from .plan_view import PlanView
from .readiness import Readiness
from .results_filter import ResultsFilter
from .resume_body import ResumeBody
from .resume_request import ResumeRequest
from .risk import Risk
from .rotate_key import RotateKey
from .rotate_secret import RotateSecret
from .rotated import Rotated
from .run import Run
from .run_counts import RunCounts
from .run_counts_counts import RunCountsCounts
from .run_events_response_200 import RunEventsResponse200
from .run_events_response_200_event import RunEventsResponse200Event
from .run_metadata import RunMetadata
from .run_page import RunPage
from .run_pending_type_0 import RunPendingType0
from .run_status import RunStatus
from .stream_token import StreamToken
from .submit_batch import SubmitBatch
from .task import Task
from .task_list import TaskList
from .task_place import TaskPlace
from .tenant_created import TenantCreated
from .tenant_info import TenantInfo
from .tenant_info_limits import TenantInfoLimits
from .tenant_info_retention import TenantInfoRetention
from .tenant_page import TenantPage
from .tenant_view import TenantView
from .tenant_view_effective_limits import TenantViewEffectiveLimits
from .tenant_view_effective_retention import TenantViewEffectiveRetention
from .thread_events_response_200 import ThreadEventsResponse200
from .thread_events_response_200_event import ThreadEventsResponse200Event
from .tool_kind import ToolKind
from .tool_spec import ToolSpec
from .usage import Usage
from .usage_day import UsageDay
from .usage_figures import UsageFigures
from .usage_report import UsageReport
from .webhook_created import WebhookCreated
from .webhook_list import WebhookList

__all__ = (
    "AgentMode",
    "AgentSpec",
    "Batch",
    "BatchCounts",
    "BatchCreated",
    "BatchEventsResponse200",
    "BatchEventsResponse200Event",
    "BatchItem",
    "BatchMetadata",
    "BatchPage",
    "BatchStatus",
    "BatchUsage",
    "CreateBatch",
    "CreateKey",
    "CreateMcpServer",
    "CreateRun",
    "CreateTenant",
    "CreateWebhook",
    "CreateWebhookEventsItem",
    "CreatedKey",
    "DecisionBody",
    "DeliveryInfo",
    "DeliveryPage",
    "Endpoint",
    "Erasure",
    "ErasureCountedType0",
    "ErasureDeleted",
    "ErasureRemainingType0",
    "ErrorBody",
    "ErrorDetail",
    "EventEnvelope",
    "EventEnvelopeType",
    "HeaderBody",
    "Health",
    "IfBusy",
    "JsonObject",
    "KeyInfo",
    "KeyList",
    "McpServer",
    "McpServerList",
    "Message",
    "MessageBody",
    "MessagePage",
    "OpenapiResponse200",
    "PlanRound",
    "PlanSpec",
    "PlanView",
    "Readiness",
    "ResultsFilter",
    "ResumeBody",
    "ResumeRequest",
    "Risk",
    "RotateKey",
    "RotateSecret",
    "Rotated",
    "Run",
    "RunCounts",
    "RunCountsCounts",
    "RunEventsResponse200",
    "RunEventsResponse200Event",
    "RunMetadata",
    "RunPage",
    "RunPendingType0",
    "RunStatus",
    "StreamToken",
    "SubmitBatch",
    "Task",
    "TaskList",
    "TaskPlace",
    "TenantCreated",
    "TenantInfo",
    "TenantInfoLimits",
    "TenantInfoRetention",
    "TenantPage",
    "TenantView",
    "TenantViewEffectiveLimits",
    "TenantViewEffectiveRetention",
    "ThreadEventsResponse200",
    "ThreadEventsResponse200Event",
    "ToolKind",
    "ToolSpec",
    "Usage",
    "UsageDay",
    "UsageFigures",
    "UsageReport",
    "WebhookCreated",
    "WebhookList",
)
