"""The errors the pipelines raise on purpose, in the agentlake tree (`schemas.errors`).

AgentlakeError
├── LakeError
│   ├── VariantError          a credit variant cannot be built (bad name, main table, no data)
│   └── RewardFunctionError   a reward module or function cannot be used as it is
├── UnknownTenantError        `forget` found no row of the tenant: nothing was deleted
├── JudgeUnavailableError     the judge's model server cannot answer: nothing was judged
└── JudgeAnswerError          (also a ValueError) the judge's answer is not the JSON asked for
"""

from __future__ import annotations

from schemas.errors import AgentlakeError, LakeError


class VariantError(LakeError):
    """A variant could not be built: a bad name, the main table named, or no trajectories yet."""


class RewardFunctionError(LakeError):
    """A reward module or function that cannot be used as it is."""


class UnknownTenantError(AgentlakeError):
    """No table holds a row of the tenant: nothing was deleted (a typo, or data not ingested yet)."""


class JudgeUnavailableError(AgentlakeError):
    """The judge's model server cannot answer (unreachable, or it refused the request); nothing was judged."""


class JudgeAnswerError(AgentlakeError, ValueError):
    """The judge's answer is not the JSON asked for; the message says what is wrong (it is shown to the judge).

    A ValueError too: answers are parsed where ValueError is what a bad value raises.
    """
