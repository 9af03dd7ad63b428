"""The core: models, pure decisions and wording. Imports nothing but pydantic and the standard library."""
