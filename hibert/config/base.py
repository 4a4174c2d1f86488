"""Base class for every config section: strict (unknown keys are errors), validated on assignment."""
from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
