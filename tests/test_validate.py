"""DAB-style validators."""

from tasks.scoring.validate import is_correct, numbers_in


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


def test_items_are_whole_words_and_case_sensitive_when_the_spec_says_so():
    """QA newcomer H2: "I could not read the tables, sorry." named the sub-category ``Tables``
    and scored correct. Items match as whole words; an everyday-word item is case-sensitive."""
    exact = {"kind": "items", "case_sensitive": True}
    assert not is_correct("I could not read the tables, sorry.", ["Tables"], exact)
    assert is_correct("The sub-category is Tables (-$17,725).", ["Tables"], exact)
    assert is_correct("tables", ["Tables"], {"kind": "items"})  # the default stays lenient
    assert not is_correct("GOOGL", ["GOOG"], {"kind": "items"})  # not inside a longer word
    assert not is_correct("Pythonic", ["Python"], {"kind": "items"})
    assert is_correct("Chris\nRenaud,  Pierre Coffin.", ["Chris Renaud, Pierre Coffin"],
                      {"kind": "items"})


def test_the_audit_matches_items_as_the_validator_does():
    """The prompt's everyday "tables" is not the ground truth ``Tables`` of a case-sensitive
    validator (QA H2: every LLM trial was flagged ground_truth_in_prompt)."""
    from tasks.scoring.audit import audit_trial

    query = {"ground_truth": ["Tables"], "validator": {"kind": "items", "case_sensitive": True}}
    trial = {"agent": "openai:m", "answer": "Tables", "terminate_reason": "return_answer"}
    messages = [
        {"index": 0, "role": "system", "content": "Query the tables of each database."},
        {"index": 1, "role": "user", "content": "Which sub-category lost the most money?"},
    ]
    checks = {f["check"] for f in audit_trial(trial, messages, query=query,
                                              question=messages[1]["content"])}
    assert "ground_truth_in_prompt" not in checks
    messages[0]["content"] = "Tables is the answer."
    checks = {f["check"] for f in audit_trial(trial, messages, query=query,
                                              question=messages[1]["content"])}
    assert "ground_truth_in_prompt" in checks


def test_invisible_characters_cannot_hide_the_other_options():
    """QA adversary: "Appleͅ, Facebookͅ, Googleͅ, IBMͅ, Microsoftͅ" (each name followed by
    U+0345, a combining mark that case-folds to a letter) scored correct on a choose-one
    question: the items check saw "Facebook" as a whole word, the listing-every-option check saw
    no option at all. Both checks now read the same canonical text with one matcher."""
    from tasks.scoring.validate import check_answer

    options = ["Apple", "Facebook", "Google", "IBM", "Microsoft"]
    v = {"kind": "items", "options": options}
    for mark in ("\u0345", "\u200b", "\u2060", "\u200d", "\u202e", "\ufeff", "\u20dd"):
        shotgun = ", ".join(o + mark for o in options)
        verdict = check_answer(shotgun, ["Facebook"], v)
        assert not verdict.ok, (repr(mark), verdict)
        assert "listing the options is not an answer" in verdict.reason, verdict.reason
        assert check_answer("Face" + mark + "book", ["Facebook"], v).ok  # the answer itself
    # marks that compose with some letters only (U+0307: ė, ṁ, ṫ but k̇): every option still
    # read as itself (QA adversary re-check)
    for mark in ("\u0301", "\u0307", "\u0308", "\u0323"):
        verdict = check_answer(", ".join(o + mark for o in options), ["Facebook"], v)
        assert not verdict.ok and "listing the options" in verdict.reason, (repr(mark), verdict)
    assert check_answer("Ｆａｃｅｂｏｏｋ", ["Facebook"], v).ok  # full-width: NFKC
    assert not check_answer("Facebook and Ｇｏｏｇｌｅ", ["Facebook"], v).ok
    assert check_answer("Café Central", ["Cafe\u0301 Central"], {"kind": "items"}).ok
    assert not is_correct("Facebookͅs", ["Facebook"], {"kind": "items"})  # still whole words
