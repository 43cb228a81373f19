"""The viewer's queries: pure functions over (ViewerLake, Scope, validated filters) returning Polars or dataclasses."""
