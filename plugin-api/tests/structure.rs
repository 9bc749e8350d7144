//! The structure of histories parsed from JSON (`plugin_api::structure`).

use history_wire::chat::history_from_str;
use plugin_api::structure::*;

#[test]
fn a_result_answers_the_first_call_of_its_id_in_the_nearest_earlier_message() {
    let call = |id: &str, name: &str| {
        format!(r#"{{"id":"{id}","type":"function","function":{{"name":"{name}","arguments":"{{}}"}}}}"#)
    };
    let history = history_from_str(&format!(
        r#"[{{"role":"user","content":"u"}},
            {{"role":"assistant","tool_calls":[{},{},{}]}},
            {{"role":"tool","tool_call_id":"y","content":"1"}},
            {{"role":"tool","tool_call_id":"x","content":"2"}},
            {{"role":"assistant","tool_calls":[{}]}},
            {{"role":"tool","tool_call_id":"x","content":"3"}},
            {{"role":"tool","tool_call_id":"y","content":"4"}},
            {{"role":"tool","tool_call_id":"z","name":"own","content":"5"}}]"#,
        call("x", "first"),
        call("y", "why"),
        call("x", "second"),
        call("x", "")
    ))
    .unwrap();
    let at = |message, call| Some(CallRef { message, call });
    let answers = answered_call_refs(&history);
    assert_eq!(
        answers,
        [None, None, at(1, 1), at(1, 0), None, at(4, 0), at(1, 1), None]
    );
    assert_eq!(
        answered_calls(&history),
        [None, None, Some(1), Some(1), None, Some(4), Some(1), None]
    );
    let names: Vec<_> = (0..history.len())
        .map(|i| tool_name(&history, &answers, i))
        .collect();
    // An unnamed call leaves the message's own name (none here); an orphan keeps its own.
    assert_eq!(
        names,
        [
            None,
            None,
            Some("why"),
            Some("first"),
            None,
            None,
            Some("why"),
            Some("own")
        ]
    );
}
