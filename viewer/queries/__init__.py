"""The viewer's queries: pure functions over (ViewerLake, Scope, validated filters) returning Polars or dataclasses."""

# A trajectory's policy versions as the registry names them: the gateway records ``served@v0004``
# (schemas.config.serving.registry_version, in SQL).
REGISTRY_VERSIONS_SQL = "list_transform(policy_versions, v -> regexp_replace(v, '^.*@', ''))"
