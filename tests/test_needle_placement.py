"""retrieval.py's needle placement on hand-made haystacks in a 4-character vocabulary (no model, no real text, fast):
the fallback rounds depth % of the haystack (depth 100: right before the question), a sentence end exactly
DEPTH_TOLERANCE away still wins over a nearer word start, the shortest context that still holds one haystack token,
and random haystack windows that reach the text's last stretch."""
import numpy as np
import pytest

from lib import retrieval, vocab
from lib.dataset import DataError

ENC = vocab.CharCodec(["a", " ", ".", "<|endoftext|>"])  # a: in a word, " ": starts one, ".": ends a sentence
A, SPACE, STOP = 0, 1, 2


def place(hay, depth, L=None):
    """build_prompt with a 1-id insert and a 1-id question: the haystack takes n = L - 2 ids."""
    L = L or len(hay) + 2
    ids, pos, actual = retrieval.build_prompt(ENC, np.array(hay), [STOP], [SPACE], L, depth)
    assert len(ids) == L and ids[pos] == STOP and ids[-1] == SPACE
    return pos, actual


@pytest.mark.parametrize("depth, pos", [(0, 0), (30, 30), (50, 50), (77, 76), (100, 99)])  # 0.77 x 99 = 76.23
def test_without_a_boundary_the_needle_goes_to_depth_percent_of_the_haystack_rounded(depth, pos):
    n = 99  # 0.3 x 99 = 29.7: rounded to 30, not floored to 29
    assert place([A] * n, depth) == (pos, round(100 * pos / n, 1))


def test_a_sentence_end_exactly_the_tolerance_away_wins_over_a_nearer_word_start():
    n = 100
    hay = [A] * n
    hay[59], hay[52] = STOP, SPACE  # a cut after the stop at 60: 0.1 x 100 = 10 from the target 50; a word at 52
    assert place(hay, 50)[0] == 60
    hay[59], hay[60] = A, STOP  # 11 away: past the tolerance, the nearest word start instead
    assert place(hay, 50)[0] == 52


def test_the_shortest_context_holds_one_haystack_token_and_one_less_is_one_clear_error():
    assert place([A] * 5, 100, L=3) == (1, 100.0)  # insert, question and one haystack id
    with pytest.raises(DataError, match="context size 2 is too short .* take 2 tokens, so use at least 3"):
        place([A] * 5, 50, L=2)


def test_random_windows_start_anywhere_from_the_first_to_the_last_whole_stretch():
    hay = np.arange(10)
    starts = {retrieval.window_start(hay, 7, np.random.default_rng(s)) for s in range(60)}
    assert starts == {0, 1, 2, 3}  # 10 - 7 + 1 windows of 7, the last one too
    assert retrieval.window_start(hay, 10, np.random.default_rng(0)) == 0
    assert retrieval.window_start(hay, 20, np.random.default_rng(0)) == 0  # shorter than L: the whole text
