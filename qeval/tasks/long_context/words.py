"""Words the generators draw from: written for qeval (no download), plain ASCII so that every
tokenizer, the shipped character-level one included, encodes them."""

from __future__ import annotations

FIRST_NAMES = (
    "Alice Arthur Beatrice Benedict Clara Cecil Dora Edmund Eleanor Felix Florence Gilbert Harriet Hugo Ida "
    "Jasper Julia Leonard Lydia Martin Matilda Nora Oliver Philippa Quentin Rosalind Samuel Sylvia Theodore "
    "Ursula Victor Winifred"
).split()
SURNAMES = (
    "Ashdown Barlow Carrow Dunmore Ellery Fairfax Garland Hollis Ingram Jessop Kendall Lockwood Marsh Norbury "
    "Oakley Pendle Quarles Redmayne Sutton Thorne Underhill Vance Whitlock Yardley"
).split()
TOWNS = (
    "Ashford Bramley Coldharbour Dunwich Eastleigh Fernhill Greystone Hartwell Ivybridge Kingsmere Longford "
    "Millbrook Northwold Oakhampton Pinecliff Redhill Saltmarsh Thornbury Westerham Yarrow"
).split()
JOBS = (
    "baker carpenter clockmaker doctor ferryman gardener glassblower innkeeper librarian miller painter "
    "potter schoolteacher shipwright stonemason tailor weaver blacksmith"
).split()
OBJECTS = (
    "lantern ledger compass kettle violin map telescope clock basket anchor bell journal chest mirror key "
    "quilt barometer loom"
).split()
COLOURS = "red blue green yellow grey white black brown silver golden".split()
WEATHER = (
    "rain fell all morning",
    "the wind came from the sea",
    "the sky was clear and cold",
    "a thick fog covered the valley",
    "snow lay on the hills",
    "the afternoon was warm and still",
)
ADJECTIVES = (
    "amber brave calm damp eager faint gentle hollow icy jolly keen lively misty narrow odd pale quiet "
    "rapid shy tidy upset vivid wary young zesty bitter clever dusty empty fancy"
).split()
NOUNS = (
    "apple bridge candle desert engine feather garden harbor island jacket kitten ladder meadow needle "
    "orchard pepper quarry river saddle tunnel umbrella valley window yacht zebra blanket cabbage dolphin"
).split()
#: Mohtashami & Jaggi (2023), "Landmark Attention", appendix: the passkey retrieval prompt
PASSKEY_HEADER = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
PASSKEY_FILLER = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"
#: RULER (Hsieh et al. 2024, NVIDIA/RULER, as in lm-eval's ruler tasks): the multi-key needle prompt
MULTIKEY_HEADER = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards."
)
MULTIKEY_NEEDLE = "One of the special magic numbers for {key} is: {value}."
MULTIKEY_QUESTION = (
    "What are all the special magic numbers for {key} mentioned in the provided text? "
    "The special magic number for {key} mentioned in the provided text is"
)
