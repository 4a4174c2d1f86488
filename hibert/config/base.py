"""Base class for every config section: strict (unknown keys are errors), validated on assignment."""
from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def flag(name: str, help_text: str, commands: tuple[str, ...] = ("evaluate", "summarize")) -> dict:
    """A setting's command-line flag (`json_schema_extra` of a head's inference settings field): declared once,
    with the field; the flag's bounds are the field's, its served param is the flag without dashes
    (finetune/inference/flags.py derives the arguments, their checks and the params). `commands`: where it is
    a flag."""
    return {"flag": name, "help": help_text, "commands": list(commands)}
