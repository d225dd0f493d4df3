"""Machine profiles and workload specs: YAML files validated by pydantic models."""
