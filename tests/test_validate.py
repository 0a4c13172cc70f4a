"""DAB-style validators."""

from tasks.validate import is_correct, numbers_in


def test_numbers_in_reads_separators_and_signs():
    assert numbers_in("total $9,090,303,780 (up -3.5%) in 2005") == [9090303780, -3.5, 2005]


def test_number_within_stated_rounding():
    v = {"kind": "number", "decimals": 1}
    assert is_correct("about 38.8 percent", 38.7636, v)
    assert is_correct("38.76", 38.7636, v)
    assert not is_correct("38.6", 38.7636, v)
    assert not is_correct("no idea", 38.7636, v)
    assert not is_correct(None, 38.7636, v)
    assert is_correct("158 films", 158.0, {"kind": "number", "decimals": 0})
    assert not is_correct("159 films", 158.0, {"kind": "number", "decimals": 0})


def test_items_all_present_case_insensitive():
    v = {"kind": "items"}
    truth = ["James Cameron", "Chris Renaud, Pierre Coffin"]
    assert is_correct("james cameron; Chris  Renaud, Pierre Coffin", truth, v)
    assert not is_correct("James Cameron", truth, v)
