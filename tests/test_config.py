"""Config schema: load, includes, overrides, errors with suggestions, YAML round-trip."""
import pytest
import yaml

from hibert.config import Config, ConfigError, config_hash, dump_yaml, load_config, save_resolved


def test_defaults_are_hibert_s():
    cfg = load_config()
    assert (cfg.model.hidden, cfg.model.layers, cfg.model.heads) == (512, 6, 8)
    assert cfg.model.ffn_dim == 2048
    assert cfg.data.max_sentence_tokens == 50 and cfg.data.max_doc_sentences == 30


@pytest.mark.parametrize("name,dims", [("hibert_s", (512, 6, 8)), ("hibert_m", (768, 6, 12))])
def test_shipped_model_sizes(name, dims):
    cfg = load_config(None, [f"model={name}"])
    assert (cfg.model.hidden, cfg.model.layers, cfg.model.heads) == dims
    assert cfg.model.ffn_dim == 4 * dims[0]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_shipped_deepspeed_configs(stage):
    assert load_config(None, [f"deepspeed=zero{stage}"]).deepspeed.zero_stage == stage


def test_recipe_with_section_includes_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: hibert_m\ndeepspeed: zero3\noptimizer: {lr: 2.0e-4}\n")
    cfg = load_config(recipe, ["model.hidden=1024", "model.heads=16", "optimizer.lr=1e-4",
                               "optimizer.betas=[0.9, 0.98]", "schedule.decay=linear",
                               "schedule.max_steps=20000"])
    assert cfg.model.hidden == 1024 and cfg.model.heads == 16 and cfg.model.layers == 6
    assert cfg.optimizer.lr == pytest.approx(1e-4)
    assert cfg.optimizer.betas == (0.9, 0.98)
    assert cfg.deepspeed.zero_stage == 3
    assert cfg.schedule.decay == "linear"


def test_shipped_recipes_load(repo):
    for recipe in sorted((repo / "configs" / "recipes").glob("*.yaml")):
        load_config(recipe)


@pytest.mark.parametrize("override,needle", [
    ("model.hiden=512", "did you mean 'model.hidden'"),
    ("optimizer.lrr=1e-4", "did you mean 'optimizer.lr'"),
    ("scheduel.warmup_steps=1", "did you mean 'schedule'"),
    ("data.tokenizer.vocab_sise=10", "did you mean 'data.tokenizer.vocab_size'"),
])
def test_unknown_key_suggests_closest(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)
    assert override.split("=")[0] in str(e.value)


def test_unknown_key_in_recipe_file_names_file(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model:\n  hidden_size: 512\n")
    with pytest.raises(ConfigError) as e:
        load_config(recipe)
    assert "bad.yaml" in str(e.value) and "model.hidden_size" in str(e.value) and "model.hidden" in str(e.value)


@pytest.mark.parametrize("override,needle", [
    ("model.hidden=abc", "model.hidden"),
    ("model.heads=5", "divisible"),
    ("deepspeed.zero_stage=4", "deepspeed.zero_stage"),
    ("objective.mask_prob=0.5", "must be 1"),
    ("schedule.decay=cosine", "schedule.decay"),
])
def test_invalid_values(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_malformed_override_and_missing_include():
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_config(None, ["model.hidden"])
    with pytest.raises(ConfigError, match="no config named 'hibert_xl'"):
        load_config(None, ["model=hibert_xl"])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model=hibert_m", "optimizer.betas=[0.9, 0.98]",
                             "data.sources=[{format: jsonl, path: x.jsonl, summary_field: s}]"])
    path = save_resolved(cfg, tmp_path / "run")
    again = load_config(path)
    assert again == cfg
    assert config_hash(again) == config_hash(cfg)
    assert Config.model_validate(yaml.safe_load(dump_yaml(cfg))) == cfg


def test_config_hash_changes_with_content():
    assert config_hash(load_config()) != config_hash(load_config(None, ["optimizer.lr=3e-4"]))


def test_interpolation_of_dotted_keys(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("run: {output_dir: out}\ndata: {output: '${run.output_dir}/data/x'}\n"
                      "slurm: {pipeline: [{name: p, command: prep, overrides: ['data.output=${run.output_dir}/d']}]}\n")
    cfg = load_config(recipe, ["run.output_dir=/tmp/elsewhere"])
    assert cfg.data.output == "/tmp/elsewhere/data/x"
    assert cfg.slurm.pipeline[0].overrides == ["data.output=/tmp/elsewhere/d"]
    assert load_config(None, ["data.output=${run.name}-data"]).data.output == "hibert-data"  # schema default
    with pytest.raises(ConfigError, match="no such key"):
        load_config(None, ["data.output=${run.nope}"])


def test_registry_alias_defaults_to_the_stage_and_can_be_named():
    from hibert.finetune.extractive.task import ExtractiveTask
    from hibert.runtime.task import Task

    stage = load_config(None, ["run.stage=in-domain"])
    assert Task.registry_alias(None, stage) == "in-domain"
    assert Task.registry_alias(None, load_config(None, ["run.stage=none"])) is None
    named = load_config(None, ["run.stage=in-domain", "tracking.alias=in-domain-only"])
    assert Task.registry_alias(None, named) == "in-domain-only"
    assert ExtractiveTask.registry_alias(None, stage) == "finetuned"
    assert ExtractiveTask.registry_alias(None, named) == "in-domain-only"
    for reserved in ("latest", "v3", "bad alias"):
        with pytest.raises(ConfigError, match="tracking.alias"):
            load_config(None, [f"tracking.alias={reserved}"])


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Billion laughs: each anchor a list of `width` aliases of the one before, `levels` deep."""
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nrun: {name: bomb}\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text, needle", [
    (_alias_bomb(), "expand to more than 100,000 values"),
    ("a: &a [*a]\n", "refers to the node that holds it"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
])
def test_alias_bombs_and_recursive_aliases_are_one_line_naming_the_file(tmp_path, text, needle):
    from conftest import run_hibert

    recipe = tmp_path / "hostile.yaml"
    recipe.write_text(text)
    out = run_hibert(["pretrain", recipe, "--print-config"], timeout=30, check=False)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and str(recipe) in out.stderr and needle in out.stderr, out.stderr[-2000:]
    with pytest.raises(ConfigError, match="refers to the node that holds it"):   # an override's value the same
        load_config(None, ["run.name=&a [*a]"])
    aliased = tmp_path / "aliased.yaml"   # ordinary anchors and aliases still load
    aliased.write_text("run: &r {name: x}\nslurm: {pipeline: [{name: p, command: prep, overrides: [&o 'a=1', *o]}]}\n")
    assert load_config(aliased).slurm.pipeline[0].overrides == ["a=1", "a=1"]
