"""The shipped YAML configs, installed with the package (so `hibert pretrain demo` works from a wheel).
YAML only; the schema that reads them is hibert/config/."""
