"""The functional-GD document's numbers and names (seed 004, arXiv 2405.17248), and the tolerances that turn its words
into numbers, for the gd-icl reproduction's claims."""

PAPER = "gd-icl"
#: the gap in top-1 accuracy below which two models count as equal ("converged", "matches", "almost equal")
ACCURACY_TOLERANCE = 0.01
#: distance_to_construction below which a trained head counts as aligned with the construction
ALIGNED = 0.5
#: the stories study: the document's language model (d' = 512, 8 heads) and its "8K attention parameters" vs "6M":
#: about 0.13 %
DOCUMENT_WIDTH, DOCUMENT_HEADS = 512, 8
DOCUMENT_RATIO_PERCENT = 0.13
