"""A tiny CSV line parser for config exports (no dependency on the csv module by design)."""


def parse_line(line: str, sep: str = ",") -> list[str]:
    """Split one CSV line into fields.

    Fields may be wrapped in double quotes; inside quotes the separator is literal and a doubled
    quote ("") stands for one quote character.
    """
    line = line.rstrip("\n")
    fields: list[str] = []
    current: list[str] = []
    in_quotes = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == '"' and i + 1 < len(line) and line[i + 1] == '"':
                current.append('"')
                i += 1
            elif ch == '"':
                in_quotes = False
            else:
                current.append(ch)
        elif ch == '"':
            in_quotes = True
        elif ch == sep:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    fields.append("".join(current))
    return fields
