"""The app's own settings: ``Service(settings=Model)`` validates ``[app]`` and ``SERVICE_APP_*`` into the model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Annotated

import pytest
from fastapi import Depends
from pydantic import BaseModel, SecretStr

from bastion import ConfigError, Service, app_settings, load_settings
from bastion._cli import main
from bastion.config import masked
from bastion.testing import ServiceClient
from tests.conftest import BASTION


class Database(BaseModel):
    url: str = "postgres://localhost/notes"
    pool_size: int = 5


class NotesSettings(BaseModel):
    port: int = 9000
    greeting: str = "hello"
    api_key: SecretStr = SecretStr("unset")
    webhook_secret: str = "unset"
    database: Database = Database()


def notes_service(**kwargs: object) -> Service:
    service = Service("notes", **kwargs)  # type: ignore[arg-type]
    v1 = service.version(1)

    @v1.get("/greeting")
    async def greeting(settings: Annotated[NotesSettings, Depends(app_settings)]) -> dict[str, object]:
        return {"greeting": settings.greeting, "port": settings.port}

    return service


def write_config(tmp_path: Path, app_table: str) -> Path:
    path = tmp_path / "service.toml"
    path.write_text(f"[token]\nenabled = false\n\n[app]\n{app_table}")
    return path


def test_app_table_and_variables_validate_into_the_model_the_environment_winning(tmp_path: Path) -> None:
    config = write_config(tmp_path, 'port = 7000\ngreeting = "from the file"\n\n[app.database]\npool_size = 3\n')
    environ = {"SERVICE_APP_GREETING": "from the environment", "SERVICE_APP_DATABASE_POOL_SIZE": "12"}
    service = notes_service(settings=NotesSettings)
    service.build(load_settings(config, environ=environ))
    assert service.settings == NotesSettings(
        port=7000, greeting="from the environment", database=Database(pool_size=12)
    )


def test_handlers_get_the_settings_through_depends_app_settings(tmp_path: Path) -> None:
    config = write_config(tmp_path, 'greeting = "hi"\n')
    with ServiceClient(notes_service(settings=NotesSettings), config=config) as client:
        response = client.get("/api/v1/greeting")
    assert (response.status_code, response.json()) == (200, {"greeting": "hi", "port": 9000})


def test_a_bad_value_and_an_unknown_key_are_named_in_the_loaders_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, 'port = "high"\nprot = 1\napi_key = 5\n')
    service = notes_service(settings=NotesSettings)
    with pytest.raises(ConfigError) as caught:
        service.build(load_settings(config, environ={"SERVICE_APP_DATABASE_POOL_SIZE": "many"}))
    assert str(caught.value) == (
        f"invalid configuration ({config}): unknown key 'app.prot'; did you mean 'app.port'?; "
        "app.port = 'high': Input should be a valid integer, unable to parse string as an integer; "
        "app.api_key = ***: Input should be a valid string; "
        "SERVICE_APP_DATABASE_POOL_SIZE='many' (app.database.pool_size): Input should be a valid integer, "
        "unable to parse string as an integer"
    )


def test_an_app_table_without_a_settings_model_is_an_unknown_key_with_a_hint(tmp_path: Path) -> None:
    config = write_config(tmp_path, "port = 7000\n")
    with pytest.raises(ConfigError) as caught:
        notes_service().build(load_settings(config, environ={}))
    assert str(caught.value) == (
        f"invalid configuration ({config}): unknown key 'app': the [app] table holds the app's own settings; "
        "declare their model with Service(settings=YourSettings) (a pydantic BaseModel)"
    )


def test_a_settings_argument_that_is_not_a_model_is_refused_at_registration() -> None:
    with pytest.raises(ConfigError, match=r"^Service\(settings=\{'port': 1\}\): expected a pydantic model class"):
        Service("notes", settings={"port": 1})  # type: ignore[arg-type]


def test_bastion_run_refuses_a_bad_app_value_with_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "notes_app.py").write_text(
        "from pydantic import BaseModel\nfrom bastion import Service\n\n\n"
        "class NotesSettings(BaseModel):\n    port: int = 9000\n\n\n"
        "service = Service('notes', settings=NotesSettings)\nservice.version(1)\n"
    )
    config = write_config(tmp_path, 'port = "high"\n')
    result = subprocess.run(
        [BASTION, "run", "notes_app:service", "--app-dir", str(tmp_path), "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert (result.returncode, result.stderr.splitlines()) == (
        2,
        [
            f"error: invalid configuration ({config}): app.port = 'high': Input should be a valid integer, "
            "unable to parse string as an integer"
        ],
    )


def test_the_display_masks_secret_fields_secret_names_and_url_passwords(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        'api_key = "k-123"\nwebhook_secret = "s-456"\n\n[app.database]\nurl = "postgres://notes:pw-789@db/notes"\n',
    )
    service = notes_service(settings=NotesSettings)
    settings = load_settings(config, environ={})
    service.build(settings)
    shown = masked(settings, app=service.settings)["app"]
    assert shown == {
        "port": 9000,
        "greeting": "hello",
        "api_key": "***",
        "webhook_secret": "***",
        "database": {"url": "postgres://notes:***@db/notes", "pool_size": 5},
    }


def test_check_config_without_the_app_shows_no_app_values_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./.env read into the environment
    config = write_config(tmp_path, 'api_key = "k-123"\n')
    assert main(["check-config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "app" not in json.loads(out)
    assert "k-123" not in out + err
    assert "[app]: not checked: the app's settings model validates it (Service(settings=...))" in err


NOTES_APP = (
    "from pydantic import BaseModel, SecretStr\nfrom bastion import Service\n\n\n"
    "class NotesSettings(BaseModel):\n    port: int = 9000\n    api_key: SecretStr = SecretStr('unset')\n\n\n"
    "service = Service('notes', settings=NotesSettings)\nservice.version(1)\n"
)


def test_check_config_with_the_app_shows_its_settings_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./.env read into the environment
    (tmp_path / "notes_settings_app.py").write_text(NOTES_APP)
    config = write_config(tmp_path, 'port = 9100\napi_key = "k-123"\n')
    argv = ["check-config", str(config), "--app", "notes_settings_app:service", "--app-dir", str(tmp_path)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["app"] == {"port": 9100, "api_key": "***"}
    assert "k-123" not in out + err
    assert "[app]: not checked" not in err


def test_check_config_with_the_app_names_a_bad_app_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes_settings_app2.py").write_text(NOTES_APP)
    config = write_config(tmp_path, "prot = 9100\n")
    argv = ["check-config", str(config), "--app", "notes_settings_app2:service", "--app-dir", str(tmp_path)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"error: invalid configuration ({config}): unknown key 'app.prot'; did you mean 'app.port'?"
    ]
