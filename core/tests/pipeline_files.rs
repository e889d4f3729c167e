//! Whole pipeline files through `pipeline::load`: a full valid file into
//! its exact spec and plan, each class of mistake at its line and column,
//! how errors print, and mutated files that must never panic.

use std::collections::BTreeMap;

use flotilla_core::pipeline::plan::{Entry, NodeStep};
use flotilla_core::pipeline::spec::{
    HostDecl, HostTarget, ItemsDecl, Move, PipelineSpec, Span, SshTarget, Stage, Step,
};
use flotilla_core::pipeline::template::Template;
use flotilla_core::pipeline::{load, Plan};

/// Every kind of host, every option, a move, a limit, an either with a
/// nested limit, continuation lines and comments.
const VALID: &str = r"# Scan PDFs, OCR them, encode them where there is room.
host scan = agent local-1
host gpus = agent labels gpu=h200,zone=eu
host ocr = ssh://ocr@10.0.0.7:2222 key id_ed25519 via local-1
host spare = ssh://spare.lan key spare

items on scan: ls /data/pdf | sed -n 's/\.pdf$//p' # kept: the shell reads it
stage split on scan jobs 2 out /scratch/pages/{id}/ retries 2 \
    timeout 15m: pdftoppm -png /data/pdf/{id}.pdf {out}/p
move pages to ocr:/tmp/pages/{id}/
limit 4 {
    # OCR is slow: two at a time per host, four in all.
    stage read on ocr jobs 2 out /tmp/text/{id}.txt consume: cat {in}/*.png | ocr > {out}
}
move text to gpus:/x/in/{id}.txt   # a comment after a move
either {
    stage fast on gpus jobs 4 out /x/{id}.enc timeout 90: enc {in} {out}
|
    move ship to spare:/y/in/{id}.txt
    limit 1 {
        stage slow on spare out /y/{id}.enc consume timeout 2h: enc --slow {in} {out} && \
            echo {id} >> /y/done
    }
}
stage report on scan timeout 1d: echo {id} done
";

fn sp(line: u32, col: u32) -> Span {
    Span { line, col }
}

fn t(text: &str) -> Template {
    Template::parse(text).expect("the test's template parses")
}

#[allow(clippy::too_many_arguments)]
fn stage(
    name: &str,
    host: &str,
    jobs: u32,
    out: Option<&str>,
    consume: bool,
    retries: u32,
    timeout_s: Option<u64>,
    command: &str,
    span: Span,
) -> Step {
    Step::Stage(Stage {
        name: name.into(),
        host: host.into(),
        jobs,
        out: out.map(t),
        consume,
        retries,
        timeout_s,
        command: t(command),
        span,
    })
}

fn mv(name: &str, host: &str, path: &str, span: Span) -> Step {
    Step::Move(Move {
        name: name.into(),
        host: host.into(),
        path: t(path),
        span,
    })
}

fn host(name: &str, target: HostTarget, line: u32) -> (String, HostDecl) {
    (
        name.into(),
        HostDecl {
            name: name.into(),
            target,
            span: sp(line, 1),
        },
    )
}

#[test]
fn a_full_file_gives_its_exact_spec() {
    let spec = load("valid.pipeline", VALID).unwrap_or_else(|e| panic!("{e}"));
    let expected = PipelineSpec {
        hosts: BTreeMap::from([
            host(
                "scan",
                HostTarget::Agent {
                    name: "local-1".into(),
                },
                2,
            ),
            host(
                "gpus",
                HostTarget::Labels {
                    labels: BTreeMap::from([
                        ("gpu".to_string(), "h200".to_string()),
                        ("zone".to_string(), "eu".to_string()),
                    ]),
                },
                3,
            ),
            host(
                "ocr",
                HostTarget::Ssh(SshTarget {
                    user: Some("ocr".into()),
                    host: "10.0.0.7".into(),
                    port: Some(2222),
                    key: Some("id_ed25519".into()),
                    via: Some("local-1".into()),
                }),
                4,
            ),
            host(
                "spare",
                HostTarget::Ssh(SshTarget {
                    user: None,
                    host: "spare.lan".into(),
                    port: None,
                    key: Some("spare".into()),
                    via: None,
                }),
                5,
            ),
        ]),
        items: ItemsDecl {
            host: "scan".into(),
            command: r"ls /data/pdf | sed -n 's/\.pdf$//p' # kept: the shell reads it".into(),
            span: sp(7, 1),
        },
        steps: vec![
            stage(
                "split",
                "scan",
                2,
                Some("/scratch/pages/{id}/"),
                false,
                2,
                Some(900),
                "pdftoppm -png /data/pdf/{id}.pdf {out}/p",
                sp(8, 1),
            ),
            mv("pages", "ocr", "/tmp/pages/{id}/", sp(10, 1)),
            Step::Limit {
                n: 4,
                steps: vec![stage(
                    "read",
                    "ocr",
                    2,
                    Some("/tmp/text/{id}.txt"),
                    true,
                    0,
                    None,
                    "cat {in}/*.png | ocr > {out}",
                    sp(13, 5),
                )],
                span: sp(11, 1),
            },
            mv("text", "gpus", "/x/in/{id}.txt", sp(15, 1)),
            Step::Either {
                branches: vec![
                    vec![stage(
                        "fast",
                        "gpus",
                        4,
                        Some("/x/{id}.enc"),
                        false,
                        0,
                        Some(90),
                        "enc {in} {out}",
                        sp(17, 5),
                    )],
                    vec![
                        mv("ship", "spare", "/y/in/{id}.txt", sp(19, 5)),
                        Step::Limit {
                            n: 1,
                            steps: vec![stage(
                                "slow",
                                "spare",
                                1,
                                Some("/y/{id}.enc"),
                                true,
                                0,
                                Some(7200),
                                // The `\` and the line break are one space;
                                // the next line's indent is dropped.
                                "enc --slow {in} {out} &&  echo {id} >> /y/done",
                                sp(21, 9),
                            )],
                            span: sp(20, 5),
                        },
                    ],
                ],
                span: sp(16, 1),
            },
            stage(
                "report",
                "scan",
                1,
                None,
                false,
                0,
                Some(86_400),
                "echo {id} done",
                sp(25, 1),
            ),
        ],
    };
    assert_eq!(spec, expected);
}

#[test]
fn the_plan_of_the_full_file() {
    let spec = load("valid.pipeline", VALID).unwrap_or_else(|e| panic!("{e}"));
    let plan = Plan::new(&spec);
    let nodes: Vec<(usize, &str, &str, bool, Vec<usize>)> = plan
        .nodes
        .iter()
        .map(|n| {
            let is_move = matches!(n.step, NodeStep::Move(_));
            (n.index, &*n.name, &*n.host, is_move, n.gates.clone())
        })
        .collect();
    assert_eq!(
        nodes,
        vec![
            (0, "split", "scan", false, vec![]),
            (1, "pages", "ocr", true, vec![]),
            (2, "read", "ocr", false, vec![0]),
            (3, "text", "gpus", true, vec![]),
            (4, "fast", "gpus", false, vec![]),
            (5, "ship", "spare", true, vec![]),
            (6, "slow", "spare", false, vec![1]),
            (7, "report", "scan", false, vec![]),
        ]
    );
    assert_eq!(plan.gates, vec![4, 1]);
    assert_eq!(plan.first, Entry::Node(0));
    assert_eq!(
        plan.next,
        vec![
            Entry::Node(1),
            Entry::Node(2),
            Entry::Node(3),
            Entry::Either(vec![Entry::Node(4), Entry::Node(5)].into()),
            Entry::Node(7),
            Entry::Node(6),
            Entry::Node(7),
            Entry::Done,
        ]
    );
    assert_eq!(plan.candidates(&plan.next[3]), vec![4, 5]);
    assert_eq!(plan.node("slow").map(|n| n.concurrency()), Some(Some(1)));
    assert_eq!(plan.node("ship").map(|n| n.concurrency()), Some(None));
}

/// `(line, col, message)` of each error `load` reports.
fn errors(text: &str) -> Vec<(u32, u32, String)> {
    match load("t.pipeline", text) {
        Ok(_) => Vec::new(),
        Err(e) => {
            e.0.into_iter()
                .map(|e| (e.span.line, e.span.col, e.message))
                .collect()
        }
    }
}

#[track_caller]
fn only(text: &str, line: u32, col: u32, needles: &[&str]) {
    let e = errors(text);
    assert_eq!(e.len(), 1, "{e:#?}");
    assert_eq!((e[0].0, e[0].1), (line, col), "{e:#?}");
    for n in needles {
        assert!(e[0].2.contains(n), "{:?} lacks {n:?}", e[0].2);
    }
}

const HEAD: &str = "host a = agent a1\nitems on a: ls\n";

#[test]
fn each_mistake_at_its_line_and_column() {
    // Unknown host, at the host's name.
    only(
        &format!("{HEAD}stage s on gpu: x {{id}}\n"),
        3,
        12,
        &["unknown host `gpu`", "host gpu = agent NAME"],
    );
    // Unknown template field, at its `{`, on a continued line.
    only(
        &format!("{HEAD}stage s on a: echo \\\n    {{id}} {{name}}\n"),
        4,
        10,
        &["unknown template field `{name}`"],
    );
    // A move with nothing to move.
    only(
        &format!("{HEAD}stage s on a: x\nmove m to a:/x/{{id}}\n"),
        4,
        1,
        &[
            "move `m` has nothing to move",
            "no stage before it declares `out`",
        ],
    );
    // `consume` on the first stage, at `consume`.
    only(
        &format!("{HEAD}stage s on a jobs 3 consume: x\n"),
        3,
        21,
        &["`consume` in stage `s`", "first step"],
    );
    // Missing `:` before the command: where it should go.
    only(
        &format!("{HEAD}stage s on a jobs 3\n"),
        3,
        20,
        &["missing", "`: COMMAND`"],
    );
    // Unclosed `{`, at the `{`.
    only(
        &format!("{HEAD}either {{\nstage s on a: x\n|\nstage t on a: y\n"),
        3,
        8,
        &["never closed"],
    );
    // Bad number, at the number.
    only(
        &format!("{HEAD}stage s on a retries many: x\n"),
        3,
        22,
        &["bad number `many` for `retries`"],
    );
    // Unknown option, at the option.
    only(
        &format!("{HEAD}stage s on a threads 4: x\n"),
        3,
        14,
        &["unknown option `threads`", "jobs N"],
    );
    // Unknown statement keyword.
    only(
        &format!("{HEAD}run s on a: x\nstage s on a: x\n"),
        3,
        1,
        &["unknown statement `run`"],
    );
    // Duplicate option, at the second.
    only(
        &format!("{HEAD}stage s on a timeout 1h timeout 2h: x\n"),
        3,
        25,
        &["`timeout` is given twice"],
    );
    // `{in}` from another host, after an either.
    only(
        &format!(
            "host b = agent b1\n{HEAD}either {{\nstage s on a out /s/{{id}}: x\n|\nstage t on b out /t/{{id}}: x\n}}\nstage u on b: cat {{in}}\n"
        ),
        9,
        19,
        &["`{in}` in stage `u` is the output of `s` on host `a`", "move"],
    );
}

#[test]
fn errors_print_as_file_line_col_and_a_caret() {
    let e = load(
        "jobs/t.pipeline",
        &format!("{HEAD}stage s on gpu: x\nmove m to a:/x\n"),
    )
    .unwrap_err();
    assert_eq!(e.0.len(), 3);
    let shown = e.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(
        lines[0],
        "jobs/t.pipeline:3:12: unknown host `gpu`: declare it with `host gpu = agent NAME` or \
         `host gpu = ssh://user@host key NAME`"
    );
    assert_eq!(lines[1], "    stage s on gpu: x");
    assert_eq!(lines[2], "               ^");
    assert!(
        lines[3].starts_with("jobs/t.pipeline:4:1: move `m` has nothing to move"),
        "{shown}"
    );
    assert_eq!(lines[4], "    move m to a:/x");
    assert_eq!(lines[5], "    ^");
    assert!(
        lines[6].starts_with("jobs/t.pipeline:4:13: the path of move `m` has no `{id}`"),
        "{shown}"
    );
    assert_eq!(lines[8], "                ^");
    // A tab before the mistake stays a tab under it.
    let e = load("t", &format!("{HEAD}\tstage s on gpu: x\n")).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("\n    \tstage s on gpu: x\n    \t           ^"),
        "{e}"
    );
}

/// xorshift64*: the mutations are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn mutated_files_never_panic() {
    // Characters the grammar cares about, and a few it does not.
    const PICKS: &[char] = &[
        '{', '}', '|', ':', '\\', '#', '\n', ' ', '\t', '=', ',', '@', '/', '.', '0', '9', 'a',
        's', '-', '_', '$', '\r', '\0', 'é', '語', '\u{feff}',
    ];
    const WORDS: &[&str] = &[
        "{in}",
        "{out}",
        "{id}",
        "{split.out}",
        "{read.out}",
        "either {\n",
        "limit 0 {\n",
        "\n|\n",
        "\n}\n",
        " consume",
        " jobs 99999",
        " out /o/{id}",
        ": ",
        "ssh://",
        " \\\n",
        "move x to ocr:",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let base: Vec<char> = VALID.chars().collect();
    let mut loaded = 0;
    for _ in 0..2000 {
        let mut text = base.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(text.len() + 1);
            match rng.below(4) {
                0 => text.insert(at, PICKS[rng.below(PICKS.len())]),
                1 if at < text.len() => {
                    let n = 1 + rng.below(12);
                    text.drain(at..(at + n).min(text.len()));
                }
                2 if at < text.len() => text[at] = PICKS[rng.below(PICKS.len())],
                _ => {
                    let w = WORDS[rng.below(WORDS.len())];
                    for (k, c) in w.chars().enumerate() {
                        text.insert(at + k, c);
                    }
                }
            }
        }
        let text: String = text.into_iter().collect();
        match load("m.pipeline", &text) {
            Ok(spec) => {
                loaded += 1;
                let plan = Plan::new(&spec);
                assert_eq!(plan.next.len(), plan.nodes.len());
            }
            Err(e) => {
                assert!(!e.0.is_empty());
                let _ = e.to_string();
                let body = text.strip_prefix('\u{feff}').unwrap_or(&text);
                let lines: Vec<&str> = body
                    .split('\n')
                    .map(|l| l.strip_suffix('\r').unwrap_or(l))
                    .collect();
                for err in &e.0 {
                    let want = lines.get(err.span.line as usize - 1).copied().unwrap_or("");
                    assert_eq!(err.line_text, want, "{err}\n--- in ---\n{text}");
                    assert!(err.span.line >= 1 && err.span.col >= 1, "{err}");
                    assert!(
                        err.span.col as usize <= want.chars().count() + 1,
                        "{err}\n--- in ---\n{text}"
                    );
                }
            }
        }
    }
    eprintln!("{loaded} of 2000 mutated files loaded");
    // Some mutations (in comments, in commands) keep the file valid.
    assert!(loaded > 50, "only {loaded} mutated files loaded");
}

#[test]
fn the_plan_of_nested_blocks() {
    let text = "host h = agent a1\nitems on h: ls\n\
        stage a on h: x\n\
        either {\n\
          stage b on h: x\n\
          either {\n stage c on h: x\n |\n stage d on h: x\n }\n\
          stage e on h: x\n\
        |\n\
          limit 2 {\n\
            stage f on h: x\n\
            either {\n stage g on h: x\n |\n limit 3 {\n stage k on h: x\n }\n }\n\
          }\n\
        }\n\
        stage i on h: x\n";
    let spec = load("nested.pipeline", text).unwrap_or_else(|e| panic!("{e}"));
    let plan = Plan::new(&spec);
    let names: Vec<&str> = plan.nodes.iter().map(|n| &*n.name).collect();
    assert_eq!(names, ["a", "b", "c", "d", "e", "f", "g", "k", "i"]);
    let gates: Vec<Vec<usize>> = plan.nodes.iter().map(|n| n.gates.clone()).collect();
    assert_eq!(
        gates,
        [
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec![0],
            vec![0],
            vec![0, 1],
            vec![]
        ]
    );
    assert_eq!(plan.gates, [2, 3]);
    use Entry::{Done, Either, Node};
    assert_eq!(plan.first, Node(0));
    assert_eq!(
        plan.next,
        [
            Either(vec![Node(1), Node(5)].into()),
            Either(vec![Node(2), Node(3)].into()),
            Node(4),
            Node(4),
            Node(8),
            Either(vec![Node(6), Node(7)].into()),
            Node(8),
            Node(8),
            Done,
        ]
    );
}
