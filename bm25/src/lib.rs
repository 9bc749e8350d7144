//! BM25 (Okapi) scoring of texts against a query: the words, the stop words and the
//! formula, one definition shared by the `relevance` plugin (docs/plugins.md#relevance),
//! which scores the units of a history, and the session service's `search_history`
//! (docs/mcp.md), which scores the messages of a whole transcript, so both rank alike.
//!
//! No dependency, no state: callers count words their own way (relevance caches counts
//! per message) and ask this crate for the numbers.

/// Term-frequency saturation.
pub const K1: f64 = 1.2;
/// Length normalization.
pub const B: f64 = 0.75;

/// English words too common to say what a message is about.
pub const DEFAULT_STOP_WORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at",
    "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could",
    "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has",
    "have", "having", "he", "her", "here", "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it",
    "its", "just", "me", "more", "most", "my", "no", "nor", "not", "now", "of", "off", "on", "once", "only",
    "or", "other", "our", "ours", "out", "over", "own", "please", "same", "she", "should", "so", "some",
    "such", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "those",
    "through", "to", "too", "under", "until", "up", "us", "very", "was", "we", "were", "what", "when",
    "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours",
];

/// The words of `text`: lower-cased, split on everything that is not a letter or digit.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// The inverse document frequency of a word found in `df` of `documents` documents
/// (the `+ 1` keeps it positive for a word in most documents).
pub fn idf(documents: f64, df: f64) -> f64 {
    (1.0 + (documents - df + 0.5) / (df + 0.5)).ln()
}

/// One query word's part of a document's score: it occurs `tf` times in a document of
/// `length` words, the documents averaging `average` words.
pub fn term_score(idf: f64, tf: f64, length: f64, average: f64) -> f64 {
    if tf == 0.0 {
        return 0.0;
    }
    let norm = K1 * (1.0 - B + B * length / average.max(1.0));
    idf * tf * (K1 + 1.0) / (tf + norm)
}

/// Each document's BM25 score against `query` (its distinct words), each document given
/// as its words. For a whole corpus at once; `relevance` uses the parts above with its
/// own caches.
pub fn scores(query: &[String], documents: &[Vec<String>]) -> Vec<f64> {
    if query.is_empty() || documents.is_empty() {
        return vec![0.0; documents.len()];
    }
    let n = documents.len() as f64;
    let average = documents.iter().map(Vec::len).sum::<usize>() as f64 / n;
    let tfs: Vec<Vec<f64>> = documents
        .iter()
        .map(|words| {
            query
                .iter()
                .map(|q| words.iter().filter(|w| *w == q).count() as f64)
                .collect()
        })
        .collect();
    let idfs: Vec<f64> = (0..query.len())
        .map(|q| idf(n, tfs.iter().filter(|tf| tf[q] > 0.0).count() as f64))
        .collect();
    documents
        .iter()
        .zip(&tfs)
        .map(|(words, tf)| {
            (0..query.len())
                .map(|q| term_score(idfs[q], tf[q], words.len() as f64, average))
                .sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Vec<String> {
        words(text).collect()
    }

    #[test]
    fn the_document_with_the_rare_word_ranks_first_and_one_without_any_scores_zero() {
        let documents = [
            doc("the build failed on the linker step"),
            doc("deploy the service to staging"),
            doc("the zebra migration uses the linker script zebra.ld"),
        ];
        let query = vec!["zebra".to_string(), "linker".to_string()];
        let scores = scores(&query, &documents);
        assert!(scores[2] > scores[0] && scores[0] > 0.0, "{scores:?}");
        assert_eq!(scores[1], 0.0);
    }

    #[test]
    fn words_are_lower_cased_and_split_on_anything_not_alphanumeric() {
        assert_eq!(
            words("Fix src/main.rs: E0425!").collect::<Vec<_>>(),
            ["fix", "src", "main", "rs", "e0425"]
        );
    }

    #[test]
    fn term_frequency_saturates_and_long_documents_weigh_less() {
        let idf = idf(10.0, 1.0);
        let once = term_score(idf, 1.0, 10.0, 10.0);
        let ten = term_score(idf, 10.0, 10.0, 10.0);
        assert!(ten > once && ten < once * (K1 + 1.0), "{once} {ten}");
        assert!(term_score(idf, 1.0, 100.0, 10.0) < once);
    }
}
