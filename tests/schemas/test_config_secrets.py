"""Issue 11: secrets stay secret in errors and in Dagster.

Before: a bad value in the settings was echoed in the ConfigError (a bearer token, the SASL
password, a PostgreSQL URL with its password), and the ValidationError chained under it printed
every input again. Dagster's resources carried the lake's secret storage options as plain config,
which Dagster stores and its UI shows.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest
from dagster import Definitions, build_resources

from pipelines.defs.assets import all_assets
from pipelines.defs.resources import SECRET_ENV_PREFIX, resources_from_settings
from schemas.config import load_settings
from schemas.errors import ConfigError

SECRET = "s3cr3t-VALUE"

# (agentlake.toml, the setting the error must name)
CASES = {
    "tokens not a table": (f'[collector]\nauth_tokens = "tok-{SECRET}:acme"\n', "collector.auth_tokens"),
    "a token's tenant not a string": (f'[collector.auth_tokens]\n"tok-{SECRET}" = 5\n', "collector.auth_tokens"),
    "a token with an empty tenant": (f'[collector.auth_tokens]\n"tok-{SECRET}" = ""\n', "collector.auth_tokens"),
    "sasl_password not a string": (f'[kafka]\nsasl_password = ["{SECRET}"]\n', "kafka.sasl_password"),
    "SASL without a mechanism": (
        f'[kafka]\nsecurity_protocol = "SASL_SSL"\nsasl_username = "u"\nsasl_password = "{SECRET}"\n',
        "kafka",
    ),
    "a key password without TLS files": (
        f'[kafka]\nssl_key_password = "{SECRET}"\nssl_certfile = "/c.pem"\n',
        "kafka",
    ),
    "postgres url with a password": (
        f'[dagster]\npostgres_url = "postgresql://agent:{SECRET}@db.example:5432/dagster"\n',
        "dagster.postgres_url",
    ),
    "a storage option not a string": (
        f'[lake]\nroot = "s3://b/lake"\n[lake.storage_options]\nAWS_SECRET_ACCESS_KEY = ["{SECRET}"]\n',
        "lake.storage_options",
    ),
    "admin token not a string": (f'[gateway]\nadmin_token = ["{SECRET}"]\n', "gateway.admin_token"),
    "a password where a section goes": (f'sasl_password = "{SECRET}"\n', "sasl_password"),
}


def _everything_shown(exc: BaseException) -> str:
    """The message and the whole traceback a user could see, chained exceptions included."""
    return str(exc) + "".join(traceback.format_exception(exc))


@pytest.mark.parametrize("case", list(CASES))
def test_config_errors_never_show_secret_values(case: str, tmp_path: Path) -> None:
    text, key = CASES[case]
    cfg = tmp_path / "agentlake.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, environ={}, discover=False)
    assert key in str(err.value)
    assert SECRET not in _everything_shown(err.value)


def test_secrets_from_the_environment_are_hidden_too() -> None:
    environ = {"AGENTLAKE_COLLECTOR__AUTH_TOKENS": f'{{"tok-{SECRET}": "acme"'}  # JSON cut short
    with pytest.raises(ConfigError) as err:
        load_settings(environ=environ, discover=False)
    assert "collector.auth_tokens" in str(err.value) and "$AGENTLAKE_COLLECTOR__AUTH_TOKENS" in str(err.value)
    assert SECRET not in _everything_shown(err.value)


def test_other_values_are_still_shown(tmp_path: Path) -> None:
    """Masking is for secrets: a bad port or a URL's user and host still show, to fix them by."""
    cfg = tmp_path / "agentlake.toml"
    cfg.write_text(f'[collector]\nhttp_port = 70000\n[dagster]\npostgres_url = "postgresql://agent:{SECRET}@db:5/d"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(cfg, environ={}, discover=False)
    assert "70000" in str(err.value) and "postgresql://agent:<hidden>@db:5/d" in str(err.value)


def test_dagster_resources_hold_secrets_as_env_vars_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What Dagster stores and shows of each resource (its configured values) holds no secret; the
    resources Dagster builds still have them."""
    sasl, aws = f"sasl-{SECRET}", f"aws-{SECRET}"
    monkeypatch.setenv("AGENTLAKE_KAFKA__SASL_PASSWORD", sasl)  # the operator's variable: named as it is
    monkeypatch.setenv(f"{SECRET_ENV_PREFIX}LAKE__STORAGE_OPTIONS", "")  # restored (removed) after the test
    settings = load_settings(
        environ={"AGENTLAKE_KAFKA__SASL_PASSWORD": sasl},
        discover=False,
        overrides={
            "state": {"dir": str(tmp_path / "state")},
            "kafka": {
                "bootstrap_servers": "broker:9093",
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": "agent",
            },
            "lake": {
                "root": "s3://bucket/lake",
                "storage_options": {"AWS_ACCESS_KEY_ID": "AKIA-id", "AWS_SECRET_ACCESS_KEY": aws},
            },
        },
    )
    resources = resources_from_settings(settings)
    defs = Definitions(assets=all_assets, resources=resources)
    shown = {
        name: json.loads(rd.config_schema.default_value_as_json_str)
        for name, rd in defs.get_repository_def().get_top_level_resources().items()
    }
    assert SECRET not in json.dumps(shown)
    assert shown["kafka"]["sasl_password"] == {"env": "AGENTLAKE_KAFKA__SASL_PASSWORD"}
    assert shown["lake"]["secret_options"] == {"env": f"{SECRET_ENV_PREFIX}LAKE__STORAGE_OPTIONS"}
    assert shown["lake"]["storage_options"] == {"AWS_ACCESS_KEY_ID": "AKIA-id"}

    with build_resources({"kafka": resources["kafka"], "lake": resources["lake"]}) as built:
        assert built.kafka.settings().sasl_password == sasl
        assert built.lake.options() == {"AWS_ACCESS_KEY_ID": "AKIA-id", "AWS_SECRET_ACCESS_KEY": aws}
