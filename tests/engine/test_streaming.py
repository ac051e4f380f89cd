"""The shared streaming detokenizer on a tokenizer whose every id is one character (so the cases are exact)."""

from prefill.engine.streaming import TextStream, safe_length


class CharTokenizer:
    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def feed(stream, text):
    out, stopped = [], False
    for ch in text:
        delta, stopped = stream.add(ord(ch))
        out.append(delta)
        if stopped:
            break
    return out, stopped


def test_without_stops_everything_streams_at_once():
    out, stopped = feed(TextStream(CharTokenizer()), "abc")
    assert out == ["a", "b", "c"] and not stopped


def test_a_possible_stop_is_held_back_then_released():
    s = TextStream(CharTokenizer(), ["END"])
    out, stopped = feed(s, "xEN")
    assert out == ["x", "", ""] and not stopped  # "EN" may still become "END"
    assert s.add(ord("d")) == ("ENd", False)  # it did not
    assert s.sent == "xENd"


def test_stop_string_ends_the_text_before_it():
    s = TextStream(CharTokenizer(), ["END", "", "zz"])
    out, stopped = feed(s, "abENDcd")
    assert stopped and "".join(out) == "ab" and s.sent == "ab"


def test_flush_sends_what_was_held():
    s = TextStream(CharTokenizer(), ["END"])
    feed(s, "okEN")
    assert s.flush() == "EN" and s.sent == "okEN" and s.flush() == ""


def test_safe_length_holds_partial_characters_and_stop_prefixes():
    assert safe_length("ab\ufffd", ()) == 2
    assert safe_length("abcE", ("END",)) == 3
    assert safe_length("abcEN", ("END", "N!")) == 3
    assert safe_length("abc", ("END",)) == 3
