"""What JSON calls a number, for the request models (pydantic alone would take true and "3" as numbers)."""


def json_number(value):
    """A before-validator: JSON's numbers only. 3.0 is an integer in JSON Schema, but true and "3" are not numbers."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be a JSON number")
    return value
