"""A collate over a list of examples takes the list of them, not one example."""
# expect: Argument "collate" to "DataLoader" has incompatible type [arg-type]

from monadl.data import DataLoader


def words(sentence: str) -> list[str]:
    return sentence.split()


DataLoader(["a b", "c"], 2, collate=words)  # error
