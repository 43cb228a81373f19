"""The trajectory viewer: read-only web pages over the lake (rollouts, one rollout, versions, health).

It reads the lake's Delta tables through DuckDB and Polars only (never Kafka) and writes nothing.

    app         create_app(settings): the Starlette app, routes gathered from viewer.pages
    lake        ViewerLake: read-only DuckDB views over the lake's tables; a missing table reads as empty
    auth        Scope: who is asking (a tenant, or the operator), from the project's bearer tokens
    templating  Jinja2 templates under viewer/templates, render()
    errors      the 400/401/404 pages
    pages/      one module per page, each exposing ``routes``
    queries/    the pages' queries: pure functions over (ViewerLake, Scope, validated filters)
"""
