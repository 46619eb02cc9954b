from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pytest

import stepscope
from stepscope.capture.config import ProfileConfig
from stepscope.capture.console import StepscopeWarning
from stepscope.errors import ConfigError, InputError


def test_every_option_has_a_description() -> None:
    for name, field in ProfileConfig.model_fields.items():
        assert field.description, name


def test_yaml_round_trip(tmp_path: Path) -> None:
    cfg = ProfileConfig(wait=1, warmup=0, active=4, repeat=3, profiled_ranks="all", record_shapes=True)
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    assert ProfileConfig.from_yaml(path) == cfg


def test_bad_values_name_the_option() -> None:
    with pytest.raises(ConfigError, match="'active'"):
        ProfileConfig.build(active=0)
    with pytest.raises(ConfigError, match="'actve': unknown option"):
        ProfileConfig.build(actve=3)
    with pytest.raises(ConfigError, match="'profiled_ranks'"):
        ProfileConfig.build(profiled_ranks=[-1])


def test_bad_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("wait: [1, 2\n")
    with pytest.raises(InputError, match=r"bad\.yaml: not valid YAML"):
        ProfileConfig.from_yaml(path)
    path.write_text("wait: -3\n")
    with pytest.raises(InputError, match=r"bad\.yaml: invalid option 'wait'"):
        ProfileConfig.from_yaml(path)
    with pytest.raises(InputError, match="no such file"):
        ProfileConfig.from_yaml(tmp_path / "missing.yaml")


def test_keyword_arguments_override_a_config(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("wait: 7\nactive: 2\n")
    monitor = stepscope.performance_monitor(config=str(path), active=5, enabled=False)
    assert (monitor.config.wait, monitor.config.active) == (7, 5)
    monitor = stepscope.performance_monitor(config=ProfileConfig(wait=9), enabled=False)
    assert monitor.config.wait == 9


def test_flags_round_trip(tmp_path: Path) -> None:
    parser = stepscope.add_profiling_args(argparse.ArgumentParser())
    args = parser.parse_args(
        [
            "--enable-profiling",
            "--profiler-output-dir",
            str(tmp_path),
            "--profiler-wait-steps",
            "1",
            "--profiler-warmup-steps",
            "0",
            "--profiler-active-steps",
            "2",
            "--profiler-repeat",
            "4",
            "--profiler-ranks",
            "0,1",
            "--enable-memory-logging",
            "--memory-log-steps",
            "3",
            "--profiler-record-shapes",
        ]
    )
    cfg = ProfileConfig.from_args(args)
    assert cfg.enabled and cfg.out_dir == str(tmp_path)
    assert (cfg.wait, cfg.warmup, cfg.active, cfg.repeat) == (1, 0, 2, 4)
    assert cfg.profiled_ranks == [0, 1] and cfg.memory_log_every == 3 and cfg.record_shapes


def test_flags_default_to_disabled_and_yaml_base(tmp_path: Path) -> None:
    parser = stepscope.add_profiling_args(argparse.ArgumentParser())
    assert ProfileConfig.from_args(parser.parse_args([])).enabled is False
    path = tmp_path / "c.yaml"
    path.write_text("enabled: true\nwait: 3\n")
    cfg = ProfileConfig.from_args(
        parser.parse_args(["--profiler-config", str(path), "--profiler-active-steps", "6"])
    )
    assert (cfg.enabled, cfg.wait, cfg.active) == (True, 3, 6)
    with pytest.warns(StepscopeWarning):
        cfg = ProfileConfig.from_args(parser.parse_args(["--enable-memory-logging"]))
    assert cfg.memory_log_every == 10
    with pytest.warns(StepscopeWarning):
        cfg = ProfileConfig.from_args(parser.parse_args(["--profiler-ranks", "all"]))
    assert cfg.profiled_ranks == "all"


def test_profiling_flags_without_enable_profiling_warn_once_naming_them() -> None:
    parser = stepscope.add_profiling_args(argparse.ArgumentParser())
    args = parser.parse_args(["--profiler-active-steps", "4", "--profiler-with-stack"])
    with pytest.warns(StepscopeWarning) as caught:
        cfg = ProfileConfig.from_args(args)
    assert cfg.enabled is False and len(caught) == 1
    assert str(caught[0].message) == (
        "stepscope: --profiler-active-steps, --profiler-with-stack given without --enable-profiling (or "
        "enabled: true in --profiler-config): profiling is off, so they do nothing"
    )
    assert caught[0].filename == __file__  # the user's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ProfileConfig.from_args(parser.parse_args(["--enable-profiling", "--profiler-active-steps", "4"]))


def test_config_errors_name_the_plain_option_and_the_yaml_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("wait: 2\nprofiled_ranks: some\nbogus: 1\n")
    with pytest.raises(InputError) as err:
        ProfileConfig.from_yaml(path)
    assert str(err.value) == (
        f"{path}: invalid option 'profiled_ranks' (line 2): should be a valid list or 'all' (got 'some'); "
        "invalid option 'bogus' (line 3): unknown option"
    )
    path.write_text("wait: 2\nactive: [1\n")
    with pytest.raises(InputError, match=r"c\.yaml: not valid YAML at line 3, column 1: "):
        ProfileConfig.from_yaml(path)
    with pytest.raises(ConfigError) as bad:
        ProfileConfig.build(profiled_ranks="some")
    assert "list[int]" not in str(bad.value) and "'profiled_ranks'" in str(bad.value)
