"""A finetuned head as an MLflow pyfunc model: the flavor written into every export (`flavor.py`) and the
loader MLflow imports to serve it (`pyfunc.py`)."""
