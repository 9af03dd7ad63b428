"""The core: models, pure decisions and wording. No I/O; it imports pydantic and the standard
library, and the SDK's typed search-attribute keys (search_attributes, queries) only."""
