"""A tiny CSV line parser for config exports (no dependency on the csv module by design)."""


def parse_line(line: str, sep: str = ",") -> list[str]:
    """Split one CSV line into fields.

    Fields may be wrapped in double quotes; inside quotes the separator is literal and a doubled
    quote ("") stands for one quote character.
    """
    fields = line.rstrip("\n").split(sep)
    return [f[1:-1] if len(f) >= 2 and f[0] == f[-1] == '"' else f for f in fields]
