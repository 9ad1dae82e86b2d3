"""Damage for the readers' fuzz tests (tests/test_guards.py, tests/test_shared_store.py): a JSON
value or a text file changed the ways a hand edit, a bad copy or a full disk change them, each
drawn by Hypothesis (draw: st.data().draw), so a failing example shrinks to the smallest damage."""
from __future__ import annotations

from hypothesis import strategies as st

VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                   st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def damage_json(data, draw):
    """data with one value somewhere in it replaced by another of any type, or a key dropped."""
    node, path = data, []
    while isinstance(node, (dict, list)) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node, key=str) if isinstance(node, dict) else range(len(node))))
        path.append(key)
        node = node[key]
    if not path:
        return draw(VALUES)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(VALUES)
    return data


TOML_VALUES = ["-1", "1e999", '""', "[]", "{}", "true", '"x"', '[1, "a"]', "0", "nan", '"../../etc"']


def damage_text(text: str, draw) -> str:
    """text with a line dropped, doubled or changed, cut short, or a byte that is no UTF-8 put in."""
    lines = text.splitlines()
    i = draw(st.integers(0, len(lines) - 1))
    how = draw(st.sampled_from(["drop", "double", "value", "cut", "garbage"]))
    if how == "drop":
        del lines[i]
    elif how == "double":
        lines.insert(i, lines[i])
    elif how == "value" and "=" in lines[i]:
        key = lines[i].split("=", 1)[0]
        lines[i] = key + "= " + draw(st.sampled_from(TOML_VALUES))
    elif how == "cut":
        return text[:draw(st.integers(0, len(text)))]
    else:
        lines[i] = lines[i] + draw(st.sampled_from(["\udcff", "\x00", "[[", "'''"]))
    return "\n".join(lines) + "\n"
