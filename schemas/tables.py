"""Arrow schemas of every Delta table and Kafka JSON value, each carrying its version.

The version travels in the schema metadata (``agentlake.schema.version``) and in the Kafka
header ``agentlake-schema-version``; bump it when a column changes meaning or type.
"""

from __future__ import annotations

import re

import pyarrow as pa

SCHEMA_VERSION_KEY = b"agentlake.schema.version"
SCHEMA_NAME_KEY = b"agentlake.schema.name"

_ts = pa.timestamp("us", tz="UTC")


def _versioned(name: str, version: int, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={SCHEMA_NAME_KEY: name.encode(), SCHEMA_VERSION_KEY: str(version).encode()})


def schema_version(schema: pa.Schema) -> int:
    """The version stamped on one of our schemas."""
    return int((schema.metadata or {})[SCHEMA_VERSION_KEY])


# Where a row came from. `kafka_offset` is the lake's position in the partition: the Kafka offset,
# plus the base recorded when a reset log was accepted (`agentlake lake accept-reset`; the
# `kafka-base:<topic>:<partition>` app transaction), so it only grows, across logs too.
_kafka_origin = [
    pa.field("kafka_topic", pa.string()),
    pa.field("kafka_partition", pa.int32()),
    pa.field("kafka_offset", pa.int64()),
]

# --- bronze ------------------------------------------------------------------------------------
SPANS = _versioned(
    "spans",
    5,
    [
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("trace_id", pa.string(), nullable=False),  # 32 lowercase hex digits
        pa.field("span_id", pa.string(), nullable=False),  # 16 lowercase hex digits
        pa.field("parent_span_id", pa.string()),
        pa.field("name", pa.string(), nullable=False),
        pa.field("kind", pa.string()),  # INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER
        pa.field("start_time", _ts, nullable=False),
        pa.field("end_time", _ts),
        pa.field("status_code", pa.string()),  # UNSET, OK, ERROR
        pa.field("status_message", pa.string()),
        pa.field("service_name", pa.string()),
        # identity, resolved with the fallbacks in schemas.attributes
        pa.field("rollout_id", pa.string(), nullable=False),  # agentlake.rollout.id, else trace id
        pa.field("attempt_id", pa.string()),
        pa.field("task_id", pa.string()),
        pa.field("agent_name", pa.string()),
        pa.field("rollout_status", pa.string()),  # agentlake.rollout.status where a span sets it (v2)
        # LLM call
        pa.field("llm_response_id", pa.string()),
        pa.field("llm_model", pa.string()),
        pa.field("policy_version", pa.string()),
        pa.field("prompt_token_ids", pa.list_(pa.int32())),
        pa.field("completion_token_ids", pa.list_(pa.int32())),
        pa.field("completion_logprobs", pa.list_(pa.float32())),
        # JSON lists of OpenAI chat messages, tool calls included, whatever convention recorded them
        # (pipelines.bronze.conventions.internal spells the shape out)
        pa.field("input_messages", pa.string()),
        pa.field("output_messages", pa.string()),
        # reward span
        pa.field("reward_value", pa.float64()),
        pa.field("reward_name", pa.string()),
        # everything else, as JSON objects
        pa.field("attributes", pa.string()),
        pa.field("resource_attributes", pa.string()),
        pa.field("received_at", _ts),
        *_kafka_origin,
        pa.field("day", pa.date32(), nullable=False),  # partition column, from start_time
        # v3: the detectors that redacted the row's text before it was stored (pipelines.bronze.redact; [] when
        # none fired); null in rows stored before v3, and in rows decoded without redaction. Last, where
        # an older table gains it on its next write (Lake.write merges the schema).
        pa.field("redacted", pa.list_(pa.string())),
        # v4: the sha256 of the served adapter's manifest.json (the registry's manifest_sha256), as the
        # gateway read it from the adapter's folder; null where it could not (another host, a base model,
        # a version without a manifest) and in rows stored before v4. Last, as `redacted`.
        pa.field("policy_sha256", pa.string()),
        # v5: the request's tool definitions, a JSON list of OpenAI tools ({"type": "function", "function":
        # {"name", "description", "parameters"}}) read by the span's convention; null when the span records
        # none and in rows stored before v5. Last, as `redacted`.
        pa.field("tools", pa.string()),
    ],
)

REWARDS = _versioned(
    "rewards",
    1,
    [
        pa.field("reward_id", pa.string(), nullable=False),  # span id, or event id, or topic:partition:offset
        pa.field("source", pa.string(), nullable=False),  # "span" | "event"
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string()),  # resolved rollout; null while unresolved
        pa.field("attempt_id", pa.string()),
        pa.field("trace_id", pa.string()),
        pa.field("llm_response_id", pa.string()),
        pa.field("span_id", pa.string()),  # the reward span, for per-step placement
        pa.field("name", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("event_time", _ts, nullable=False),
        *_kafka_origin,
        pa.field("day", pa.date32(), nullable=False),
    ],
)

QUARANTINE = _versioned(
    "quarantine",
    1,
    [
        *_kafka_origin,
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.string()),  # JSON object
        pa.field("error", pa.string(), nullable=False),
        pa.field("quarantined_at", _ts, nullable=False),
    ],
)

# --- silver ------------------------------------------------------------------------------------
LLM_CALL = pa.struct(
    [
        pa.field("span_id", pa.string()),
        pa.field("step", pa.int32()),
        pa.field("agent_name", pa.string()),
        pa.field("start_time", _ts),
        pa.field("end_time", _ts),
        pa.field("llm_response_id", pa.string()),
        pa.field("llm_model", pa.string()),
        pa.field("policy_version", pa.string()),
        pa.field("prompt_token_ids", pa.list_(pa.int32())),
        pa.field("completion_token_ids", pa.list_(pa.int32())),
        pa.field("completion_logprobs", pa.list_(pa.float32())),
        pa.field("input_messages", pa.string()),
        pa.field("output_messages", pa.string()),
        pa.field("policy_sha256", pa.string()),  # trajectories v2 (spans v4); absent in older rows
        pa.field("tools", pa.string()),  # trajectories v3 (spans v5): the call's tool definitions, JSON
    ]
)

REWARD_ENTRY = pa.struct(
    [
        pa.field("reward_id", pa.string()),
        pa.field("name", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("source", pa.string()),
        pa.field("span_id", pa.string()),
        pa.field("event_time", _ts),
    ]
)

TRAJECTORIES = _versioned(
    "trajectories",
    3,  # v2: calls[].policy_sha256; v3: calls[].tools
    [
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("attempt_id", pa.string()),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("trace_ids", pa.list_(pa.string())),
        pa.field("status", pa.string(), nullable=False),  # running | finished | failed | timed_out
        pa.field("agents", pa.list_(pa.string())),
        pa.field("n_spans", pa.int32()),
        pa.field("n_llm_calls", pa.int32()),
        pa.field("n_repaired_parents", pa.int32()),  # spans re-attached to the virtual root
        pa.field("start_time", _ts),
        pa.field("end_time", _ts),
        pa.field("calls", pa.list_(LLM_CALL)),  # in order of start time
        pa.field("rewards", pa.list_(REWARD_ENTRY)),
        pa.field("final_reward", pa.float64()),  # the reward named "primary", else the first
        pa.field("policy_versions", pa.list_(pa.string())),
        pa.field("updated_at", _ts, nullable=False),
        pa.field("day", pa.date32(), nullable=False),
    ],
)

# --- gold --------------------------------------------------------------------------------------
TRANSITIONS = _versioned(
    "transitions",
    5,  # v3: reward_source; v4: policy_sha256; v5: token_status
    [
        # rollout_id/attempt_id/step, + "@<tenant>" for any tenant but "default" (pipelines/keys.py)
        pa.field("transition_id", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("attempt_id", pa.string()),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("group_id", pa.string(), nullable=False),  # normalization group (the task, else rollout)
        pa.field("step", pa.int32(), nullable=False),
        pa.field("agent_name", pa.string()),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_logprobs", pa.list_(pa.float32())),  # behaviour logprobs; null if unknown
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),  # per response token; 0 = observation
        pa.field("reward", pa.float64(), nullable=False),
        # where the rollout's final reward came from: "span" | "event" | "fn:<name>@<version>" (a reward
        # function) | "default" (none came within credit.reward_horizon_s: credit.missing_reward stands
        # in); null in rows from before v3
        pa.field("reward_source", pa.string()),
        pa.field("return", pa.float64(), nullable=False),
        pa.field("advantage", pa.float64(), nullable=False),
        # what the rollout's score was compared with (group mean, leave-one-out mean, running value)
        pa.field("baseline", pa.float64()),
        pa.field("policy_version", pa.string()),
        pa.field("llm_model", pa.string()),
        pa.field("token_source", pa.string(), nullable=False),  # "exact" | "retokenized"
        pa.field("credit_mode", pa.string(), nullable=False),
        pa.field("advantage_mode", pa.string(), nullable=False),
        pa.field("merged_calls", pa.int32(), nullable=False),
        pa.field("created_at", _ts, nullable=False),
        pa.field("day", pa.date32(), nullable=False),
        # v4: the sha256 of the manifest of the adapter that served the call (spans.policy_sha256), which
        # with policy_version says exactly which registered files sampled the row; null when unknown
        # and in rows from before v4.
        pa.field("policy_sha256", pa.string()),
        # v5: how the row's tokens are known (pipelines.gold.token_check): "exact" (the serving engine's ids),
        # "verified" (retokenized, equal to the served model's /tokenize of the same chat), "unverified"
        # (retokenized, no server answered) or "mismatch" (retokenized, the server renders other ids; left
        # out unless credit.train_token_mismatch). Of a merged row, its most doubtful call's. Null before v5.
        pa.field("token_status", pa.string()),
    ],
)

MODEL_VERSIONS = _versioned(
    "model_versions",
    4,
    [
        pa.field("version", pa.string(), nullable=False),  # "v0001", ...
        pa.field("version_number", pa.int64(), nullable=False),
        pa.field("parent_version", pa.string()),
        pa.field("base_model", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # "lora" | "full"
        pa.field("path", pa.string(), nullable=False),  # adapter or weights folder on the trainer's disk
        pa.field("served_name", pa.string()),
        pa.field("train_table", pa.string()),
        pa.field("train_version_start", pa.int64()),
        pa.field("train_version_end", pa.int64()),
        pa.field("n_transitions", pa.int64()),
        pa.field("config", pa.string()),  # JSON
        pa.field("metrics", pa.string()),  # JSON
        pa.field("publish_status", pa.string(), nullable=False),  # pending|published|failed|rejected|rolled_back
        pa.field("publish_error", pa.string()),
        pa.field("created_at", _ts, nullable=False),
        pa.field("published_at", _ts),
        # v2: where the version's files are stored and the sha256 of their manifest (trainer.artifacts);
        # null in rows written before v2 (an older table gains the columns on its next write).
        pa.field("artifact_uri", pa.string()),
        pa.field("manifest_sha256", pa.string()),
        # v3: the agent whose policy line the version belongs to (`trainer.agents`, served as
        # `<served_name>-<agent>`); null: the single policy served as `model.served_name`.
        pa.field("agent", pa.string()),
        # v4: where the round that trained the version was tracked (trainer.trackers): an MLflow run's page
        # (its id last), a TensorBoard or W&B run folder; null without a tracker and in rows before v4.
        pa.field("tracking_url", pa.string()),
    ],
)

# Which transitions each model version trained on: one row per (version, transition). Pending data for
# the next round is `transitions` anti-joined with this table on (train_table, transition_id).
TRAINING_LINEAGE = _versioned(
    "training_lineage",
    1,
    [
        pa.field("model_version", pa.string(), nullable=False),  # model_versions.version
        pa.field("transition_id", pa.string(), nullable=False),  # transitions.transition_id
        pa.field("rollout_id", pa.string()),
        pa.field("train_table", pa.string(), nullable=False),  # normalized table URI (schemas.uris)
        pa.field("table_version", pa.int64(), nullable=False),  # the Delta version the row was read at
        pa.field("consumed_at", _ts, nullable=False),
    ],
)

# The LLM judge's cache (pipelines/silver/judging): one row per member of each judged group. ``judgement_id``
# hashes what was asked (judge version and rubric, the members, the prompt), so asking again is a
# look-up: a rerun or backfill calls the model only for groups whose question changed. It holds the
# judge's words about a trajectory (``reason``): `agentlake forget` and retention reach it.
JUDGEMENTS = _versioned(
    "judgements",
    1,
    [
        pa.field("judgement_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # the reward source: fn:<name>@<version>
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("attempt_id", pa.string()),
        pa.field("position", pa.int32(), nullable=False),  # the member's number in the prompt (1-based)
        pa.field("members", pa.int32(), nullable=False),  # the group's size
        pa.field("status", pa.string(), nullable=False),  # "ok" | "unparsed" (no scores after the retry)
        pa.field("score", pa.float64()),  # what the judge said
        pa.field("reward", pa.float64()),  # its rank in the group, in [0, 1]
        pa.field("reason", pa.string()),  # the judge's words about it (content)
        pa.field("model", pa.string(), nullable=False),
        pa.field("calls", pa.int32(), nullable=False),  # requests it took (2: retried once)
        pa.field("created_at", _ts, nullable=False),
    ],
)

# What was deleted, by whom and when (`agentlake forget`, per-table retention): one row per deletion.
# A rebuild from Kafka applies these again, so forgotten rows stay forgotten (pipelines.lake.forget).
# It keeps the ids that name the forgotten data (tenant, rollout), never its content.
DELETION_COUNT = pa.struct(
    [
        pa.field("table", pa.string()),
        pa.field("rows", pa.int64()),  # rows the deletion removed from that table
        pa.field("version", pa.int64()),  # the table's Delta version after the delete
    ]
)

DELETIONS = _versioned(
    "deletions",
    1,
    [
        pa.field("deletion_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # "forget" | "retention"
        pa.field("tenant", pa.string()),  # null: every tenant (retention)
        pa.field("rollout_id", pa.string()),  # forget --rollout
        pa.field("before", _ts),  # forget --before, or the retention cutoff
        pa.field("tables", pa.list_(pa.string()), nullable=False),  # the tables the deletion applies to
        pa.field("removed", pa.list_(DELETION_COUNT)),
        pa.field("rows_removed", pa.int64(), nullable=False),
        pa.field("requested_by", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("deleted_at", _ts, nullable=False),
    ],
)

# --- Kafka JSON values -------------------------------------------------------------------------
REWARD_EVENT = _versioned(
    "reward_event",
    1,
    [
        pa.field("value", pa.float64(), nullable=False),
        pa.field("name", pa.string()),  # default "primary"
        # at least one of these three names the rollout (checked by validate_reward_event)
        pa.field("rollout_id", pa.string()),
        pa.field("trace_id", pa.string()),
        pa.field("response_id", pa.string()),
        pa.field("attempt_id", pa.string()),
        pa.field("event_id", pa.string()),  # idempotency key chosen by the sender
        pa.field("timestamp", _ts),  # when the reward was decided; default: receive time
        pa.field("tenant", pa.string()),  # set by the collector from the auth token
    ],
)

# An announcement (published | failed | rolled_back: serving already changed) or, since v2, a command
# (release: "serve `version` under `served_name`"; since v3 also unload: "serve nothing under `served_name`",
# sent when the first publish of a line failed) that each replica's loader (serving.loader) carries out and
# answers on the acks topic with a MODEL_RELEASE_ACK of the same release_id. v3 adds a status value only: v2
# records read the same. v4: evaluate, "score `version` beside what you serve on `eval_tasks`", for the canary
# named in `targets` only (serving.canary); older records read with eval_tasks null.
MODEL_RELEASE_EVENT = _versioned(
    "model_release_event",
    4,
    [
        pa.field("version", pa.string(), nullable=False),
        pa.field("served_name", pa.string(), nullable=False),
        pa.field("base_model", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("parent_version", pa.string()),
        # published | failed | rolled_back | release (v2) | unload (v3) | evaluate (v4)
        pa.field("status", pa.string(), nullable=False),
        pa.field("timestamp", _ts, nullable=False),
        pa.field("error", pa.string()),
        # v2, set on release commands: the id acks answer to, where the files are and the hash that pins them,
        # and the replicas that should act (empty or null: every replica)
        pa.field("release_id", pa.string()),
        pa.field("artifact_uri", pa.string()),
        pa.field("manifest_sha256", pa.string()),
        pa.field("targets", pa.list_(pa.string())),
        # v4, set on evaluate commands: the held-out tasks, inline (serving.canary caps their size)
        pa.field(
            "eval_tasks",
            pa.list_(pa.struct([pa.field("prompt", pa.string(), False), pa.field("answer", pa.string(), False)])),
        ),
    ],
)

# A replica's answer to one release command: what was asked, whether it worked, and what the replica
# serves under `served_name` after handling it (read back from vLLM, hashed from the manifest it loaded).
_release_ack_fields = [
    pa.field("release_id", pa.string(), nullable=False),
    pa.field("replica", pa.string(), nullable=False),
    pa.field("served_name", pa.string(), nullable=False),
    pa.field("version", pa.string(), nullable=False),  # requested
    pa.field("manifest_sha256", pa.string()),  # requested
    pa.field("ok", pa.bool_(), nullable=False),
    pa.field("error", pa.string()),
    pa.field("serving_version", pa.string()),  # null: nothing is served under served_name
    pa.field("serving_sha256", pa.string()),
    pa.field("seconds", pa.float64(), nullable=False),  # handling time on the replica
    pa.field("timestamp", _ts, nullable=False),
]
# v2: an answer to an evaluate command carries the scores (fractions of tasks answered) and how many tasks;
# null on every other ack and in v1 records. served_versions keeps release acks, without these.
# v3: and each task's score, in the command's task order (1.0 answered, 0.0 not), so the publisher decides on the
# paired bootstrap (serving.evaluation); null in older records, which the publisher refuses to decide on.
MODEL_RELEASE_ACK = _versioned(
    "model_release_ack",
    3,
    [
        *_release_ack_fields,
        pa.field("eval_candidate", pa.float64()),
        pa.field("eval_serving", pa.float64()),
        pa.field("eval_task_count", pa.int32()),
        pa.field("eval_candidate_scores", pa.list_(pa.float64())),
        pa.field("eval_serving_scores", pa.list_(pa.float64())),
    ],
)

# Every release ack a publisher read (serving.served): the latest row per (replica, served_name) is what
# that replica serves now.
SERVED_VERSIONS = _versioned(
    "served_versions",
    1,
    [*_release_ack_fields, pa.field("recorded_at", _ts, nullable=False)],
)

# One row per evaluation of a model version on a held-out task set (serving.evaluation_table): the demo's
# before/after, each eval gate and canary decision. `mean` and its interval are the version's (a percentile
# bootstrap over tasks, `confidence`); `diff` = mean - baseline's mean on the same tasks and samples, with its
# paired interval and `verdict` ("gain beyond noise" | "loss beyond noise" | "within noise"); the baseline
# columns are null when nothing was compared. `source`: "demo" | "gate" | "canary".
EVALUATIONS = _versioned(
    "evaluations",
    1,
    [
        pa.field("version", pa.string(), nullable=False),  # model_versions.version, or "base"
        pa.field("agent", pa.string()),  # the policy line (model_versions.agent); null: the single policy
        pa.field("task_set", pa.string(), nullable=False),
        pa.field("n_tasks", pa.int64(), nullable=False),
        pa.field("n_samples", pa.int64(), nullable=False),  # samples per task
        pa.field("mean", pa.float64(), nullable=False),
        pa.field("ci_low", pa.float64(), nullable=False),
        pa.field("ci_high", pa.float64(), nullable=False),
        pa.field("confidence", pa.float64(), nullable=False),
        pa.field("baseline_version", pa.string()),
        pa.field("baseline_mean", pa.float64()),
        pa.field("diff", pa.float64()),
        pa.field("diff_ci_low", pa.float64()),
        pa.field("diff_ci_high", pa.float64()),
        pa.field("verdict", pa.string()),
        pa.field("source", pa.string(), nullable=False),
        pa.field("evaluated_at", _ts, nullable=False),
    ],
)

TABLES: dict[str, pa.Schema] = {
    "spans": SPANS,
    "rewards": REWARDS,
    "trajectories": TRAJECTORIES,
    "transitions": TRANSITIONS,
    "model_versions": MODEL_VERSIONS,
    "training_lineage": TRAINING_LINEAGE,
    "quarantine": QUARANTINE,
    "deletions": DELETIONS,
    "judgements": JUDGEMENTS,
    "served_versions": SERVED_VERSIONS,
    "evaluations": EVALUATIONS,
}

EVENTS: dict[str, pa.Schema] = {
    "reward_event": REWARD_EVENT,
    "model_release_event": MODEL_RELEASE_EVENT,
    "model_release_ack": MODEL_RELEASE_ACK,
}

# By day only, not by tenant: the pipeline commits small batches holding rows of every tenant, so a
# tenant partition multiplies files by the tenants per commit. Measured (benchmarks/
# bench_tenant_partitioning.py, 200 commits of 40 rows, 20 tenants): 4000 files instead of 200, writes
# 17.1 s instead of 9.6, a full read 0.92 s instead of 0.14, compaction 3.2 s instead of 0.37; what it
# buys is deleting a tenant in 0.04 s instead of 0.44 s (its day files rewritten). Deletes are rare,
# reads and commits constant; and changing a table's partitioning means rewriting the whole table.
PARTITION_COLUMNS: dict[str, list[str]] = {
    "spans": ["day"],
    "rewards": ["day"],
    "trajectories": ["day"],
    "transitions": ["day"],
    "model_versions": [],
    "training_lineage": [],
    "quarantine": [],
    "deletions": [],
    "judgements": [],
    "served_versions": [],
    "evaluations": [],
}

# Columns holding what users and agents wrote (messages, attribute values, error text). Delta keeps
# each data file's min/max per column in its log, which outlives a delete + vacuum: a forgotten
# message would stay readable there. These columns get no statistics (nothing skips files on them).
CONTENT_COLUMNS: dict[str, tuple[str, ...]] = {
    "spans": ("status_message", "input_messages", "output_messages", "attributes", "resource_attributes", "tools"),
    "quarantine": ("headers", "error", "value"),
    "judgements": ("reason",),
}


# --- variants -----------------------------------------------------------------------------------
# A variant is a table built again from the same source with other settings, beside the original:
# `transitions__<name>` holds `transitions` rows under other credit settings (pipelines/gold/variants.py).
# It has its base table's schema, partitioning and properties; the incremental pipeline never writes it.
VARIANT_SEPARATOR = "__"
VARIANT_BASES = ("transitions",)  # the tables that may have variants
VARIANT_NAME_MAX = 48
_VARIANT_NAME = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
# The tables a trainer may read: `transitions` or one of its variants (`trainer.table`).
TRAINABLE_TABLE_PATTERN = rf"^transitions({VARIANT_SEPARATOR}{_VARIANT_NAME.pattern})?$"
# Delta commit metadata of `transitions` and its variants: the CreditSettings (JSON) a commit's rows were built with.
CREDIT_METADATA_KEY = "agentlake.credit"


def transitions_variant(name: str) -> str:
    """The table name of the `transitions` variant ``name`` (``transitions__<name>``); a ValueError says why not."""
    if not isinstance(name, str) or len(name) > VARIANT_NAME_MAX or not _VARIANT_NAME.fullmatch(name):
        raise ValueError(
            f"variant name {name!r}: use 1 to {VARIANT_NAME_MAX} lowercase letters, digits and single "
            "underscores (e.g. discounted_g0p9_rloo)"
        )
    return f"transitions{VARIANT_SEPARATOR}{name}"


def base_table(name: str) -> str | None:
    """The known table ``name`` is (itself) or is a variant of; None when it is neither."""
    if name in TABLES:
        return name
    base, sep, variant = name.partition(VARIANT_SEPARATOR)
    if sep and base in VARIANT_BASES and _VARIANT_NAME.fullmatch(variant) and len(variant) <= VARIANT_NAME_MAX:
        return base
    return None


def table_configuration(name: str) -> dict[str, str]:
    """Delta table properties a table is created with: statistics on every column but its content."""
    name = base_table(name) or name
    content = CONTENT_COLUMNS.get(name)
    if not content:
        return {}
    kept = [f.name for f in TABLES[name] if f.name not in content]
    return {"delta.dataSkippingStatsColumns": ",".join(kept)}
