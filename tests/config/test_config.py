"""Config: YAML lists only what differs; mistakes name the key and the file."""
from pathlib import Path

import pytest

from transientvod.config import ConfigError, config_from_yaml, load_config, to_yaml, write_resolved

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_then_file_then_overrides(tmp_path):
    path = write(tmp_path, "train: {steps: 300}\nmodel: {depth: 8}\n")
    config = load_config(path, ["train.commit_every=25", "optimizer.lr=0.2"])
    assert config.train.steps == 300
    assert config.model.depth == 8
    assert config.model.width == 16  # default kept
    assert config.train.commit_every == 25
    assert config.optimizer.lr == 0.2
    assert isinstance(config.optimizer.lr, float)


def test_unknown_key_names_key_and_file(tmp_path):
    path = write(tmp_path, "train: {stpes: 300}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "train.stpes" in str(e.value) and str(path) in str(e.value)


def test_unknown_section_names_it(tmp_path):
    path = write(tmp_path, "trian: {steps: 3}\n")
    with pytest.raises(ConfigError, match="unknown key 'trian'"):
        load_config(path)


def test_wrong_type_names_key_and_file(tmp_path):
    path = write(tmp_path, "train: {steps: many}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert "train.steps" in message and "int" in message and str(path) in message


def test_bool_is_not_an_int(tmp_path):
    with pytest.raises(ConfigError, match="train.steps"):
        load_config(write(tmp_path, "train: {steps: true}\n"))


def test_missing_file_is_one_sentence(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_invalid_yaml_names_the_line(tmp_path):
    with pytest.raises(ConfigError, match="line 2"):
        load_config(write(tmp_path, "train: {steps: 3}\nmodel: depth: 8\n"))


def test_min_np_above_max_np(tmp_path):
    with pytest.raises(ConfigError, match="cluster.min_np is 3, more than cluster.max_np"):
        load_config(write(tmp_path, "cluster: {min_np: 3, max_np: 2}\n"))


def test_unknown_model_and_dataset_names():
    with pytest.raises(ConfigError, match="model.name is 'vgg'"):
        load_config(None, ["model.name=vgg"])
    with pytest.raises(ConfigError, match="data.dataset is 'mnist'"):
        load_config(None, ["data.dataset=mnist"])


def test_checkpoint_interval_must_hold_committed_state():
    with pytest.raises(ConfigError, match="multiple of"):
        load_config(None, ["train.commit_every=30", "train.checkpoint_every=100"])


@pytest.mark.parametrize("url", ["gs://", "gs:///ckpt/run7", "s3://", "S3:///ckpt"])
def test_object_store_checkpoint_dir_without_a_bucket_is_one_sentence(url):
    with pytest.raises(ConfigError) as raised:
        load_config(None, [f"checkpoint.dir={url}"])
    message = str(raised.value)
    scheme = url.split(":")[0].lower()
    assert message.endswith(f": checkpoint.dir is {url!r}, which names no bucket; "
                            f"write it as {scheme}://bucket/prefix."), message
    # With a bucket it loads.
    assert load_config(None, [f"checkpoint.dir={scheme}://ckpt-bucket/run7"]).checkpoint.dir == f"{scheme}://ckpt-bucket/run7"


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["train.steps"])


def test_resolved_config_round_trips(tmp_path):
    config = load_config(REPO / "configs" / "demo.yaml", ["train.steps=123"])
    path = write_resolved(config, tmp_path)
    again = load_config(path)
    assert again == config
    assert config_from_yaml(to_yaml(config), "inline") == config


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    load_config(path)


def test_a_budget_of_zero_or_less_is_one_sentence():
    for value in ("0", "-2.5", ".nan"):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"cost.budget_usd={value}"])
        assert str(e.value).startswith("defaults with overrides: cost.budget_usd is ")
        assert str(e.value).endswith("set it to the most the job may cost, a positive number of dollars "
                                     "(or null for no limit).")
    assert load_config(None, ["cost.budget_usd=12.5"]).cost.budget_usd == 12.5
    assert load_config(None, []).cost.budget_usd is None


def test_head_ports_default_to_a_range_below_the_ephemeral_ports():
    assert load_config(None).cluster.head_ports == [30000, 30099]
    assert load_config(None, ["cluster.head_ports=[40000, 40001]"]).cluster.head_ports == [40000, 40001]


def test_a_head_port_range_too_small_for_what_the_head_binds_is_one_sentence():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["cluster.head_ports=[30000, 30000]"])
    assert str(e.value) == ("defaults with overrides: cluster.head_ports is [30000, 30000], "
                            "1 port, and the head of a job with remote hosts binds 2 (the job channel and the "
                            "MLflow server of a local SQLite store); give a range of at least 2.")


@pytest.mark.parametrize("value", ["[30010, 30000]", "[30000]", "[0, 70000]", "30000", "[true, 30001]"])
def test_a_head_port_range_that_is_not_one_is_one_sentence(value):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"cluster.head_ports={value}"])
    assert "cluster.head_ports" in str(e.value) and "\n" not in str(e.value)
