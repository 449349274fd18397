"""Drawing and writing the report: :mod:`.html` assembles the page, :mod:`.plots` draws."""

__all__: list[str] = []
