"""Typed, validated configuration shared by every command (one schema for the whole platform)."""
from hibert.config.load import (
    ConfigError,
    config_hash,
    config_to_dict,
    configs_root,
    dump_yaml,
    load_config,
    save_resolved,
)
from hibert.config.schema import Config

__all__ = ["Config", "ConfigError", "config_hash", "config_to_dict", "configs_root", "dump_yaml",
           "load_config", "save_resolved"]
