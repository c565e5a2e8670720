"""UTF-16 positions <-> string offsets, including characters outside the BMP and clamping."""

from lsprotocol.types import Position

from lsp_server.positions import offset_at, position_at, utf16_len

TEXT = 'a = "😀x"\nb = "héllo"\r\nlast'


def test_utf16_len_counts_astral_characters_twice():
    assert utf16_len("😀") == 2
    assert utf16_len("é") == 1
    assert utf16_len('a = "😀x"') == 9


def test_offset_after_an_emoji_uses_two_code_units():
    # Column 7 in UTF-16 is right after the emoji; in Python that is index 6.
    assert TEXT[offset_at(TEXT, Position(line=0, character=7))] == "x"


def test_offsets_on_later_lines_and_crlf():
    offset = offset_at(TEXT, Position(line=1, character=6))
    assert TEXT[offset:offset + 4] == "éllo"
    # Past the end of a CRLF line clamps before the line break, not inside it.
    end = offset_at(TEXT, Position(line=1, character=99))
    assert TEXT[end:end + 2] == "\r\n"


def test_positions_past_the_end_clamp():
    assert offset_at(TEXT, Position(line=99, character=0)) == len(TEXT)
    assert offset_at(TEXT, Position(line=2, character=99)) == len(TEXT)
    assert offset_at("", Position(line=3, character=3)) == 0


def test_position_at_round_trips():
    for offset in range(len(TEXT) + 1):
        if TEXT[offset - 1:offset + 1] == "\r\n":
            continue  # between \r and \n is not an addressable position
        assert offset_at(TEXT, position_at(TEXT, offset)) == offset


def test_utf32_encoding_counts_code_points():
    assert TEXT[offset_at(TEXT, Position(line=0, character=6), encoding="utf-32")] == "x"
