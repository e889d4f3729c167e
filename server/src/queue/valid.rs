//! A command job as submitted, checked field by field against the limits
//! (`flotilla_core::job::limits`) before anything is written: the first
//! field that is wrong is named. Submissions and retries both pass here.

use flotilla_core::api::{FieldError, SubmitJob};
use flotilla_core::job::{check_env, check_labels, check_name, check_output_path, limits, JobSpec};

use super::submit::NewJob;

/// A submission whose fields have been checked; the submitter, where the
/// submission names one, is still to be allowed (an admin's call).
pub struct ValidJob {
    /// The job, its submitter and owner not yet set.
    pub job: NewJob,
    /// The submitter the submission names, if any.
    pub submitter: Option<String>,
}

impl TryFrom<SubmitJob> for ValidJob {
    type Error = FieldError;

    /// Checks every field of a submission, naming the first that is wrong.
    fn try_from(body: SubmitJob) -> Result<Self, FieldError> {
        match &body.spec {
            JobSpec::Revdeps(_) => {
                return Err(FieldError::new(
                    "kind",
                    "revdeps jobs are made by the server: submit a run with POST /api/v1/revdeps",
                ))
            }
            JobSpec::Tile(_) => {
                return Err(FieldError::new(
                    "kind",
                    "tile jobs are made by the server: submit a region with POST /api/v1/rois",
                ))
            }
            JobSpec::Step(_) => {
                return Err(FieldError::new(
                    "kind",
                    "step jobs are made by the server: run a pipeline with POST /api/v1/pipelines",
                ))
            }
            JobSpec::Command(c) => {
                if c.command.trim().is_empty() {
                    return Err(FieldError::at("command", "is empty"));
                }
                if c.command.len() > limits::MAX_COMMAND_BYTES {
                    return Err(FieldError::at(
                        "command",
                        format_args!("is longer than {} bytes", limits::MAX_COMMAND_BYTES),
                    ));
                }
                if c.command.contains('\0') {
                    return Err(FieldError::at("command", "contains a NUL byte"));
                }
                if let Some(w) = &c.workdir {
                    if w.len() > limits::MAX_PATH_BYTES {
                        return Err(FieldError::at(
                            "workdir",
                            format_args!("is longer than {} bytes", limits::MAX_PATH_BYTES),
                        ));
                    }
                    if w.contains('\0') {
                        return Err(FieldError::at("workdir", "contains a NUL byte"));
                    }
                }
                if let Some(t) = c.timeout_s {
                    if t == 0 || t > limits::MAX_TIMEOUT_S {
                        return Err(FieldError::at(
                            "timeout_s",
                            format_args!("must be between 1 and {}", limits::MAX_TIMEOUT_S),
                        ));
                    }
                }
                if c.outputs.len() > limits::MAX_OUTPUTS {
                    return Err(FieldError::at(
                        "outputs",
                        format_args!("lists more than {} files", limits::MAX_OUTPUTS),
                    ));
                }
                for (i, o) in c.outputs.iter().enumerate() {
                    check_output_path(o)
                        .map_err(|why| FieldError::at(format!("outputs[{i}]"), why))?;
                }
                check_env(&c.env)?;
                if let Some(name) = c.secret_env.iter().find(|n| !c.env.contains_key(*n)) {
                    return Err(FieldError::at(
                        "secret_env",
                        format_args!("names `{name}`, which is not in `env`"),
                    ));
                }
            }
        }
        if !(1..=limits::MAX_ATTEMPTS).contains(&body.max_attempts) {
            return Err(FieldError::at(
                "max_attempts",
                format_args!("must be between 1 and {}", limits::MAX_ATTEMPTS),
            ));
        }
        if !limits::PRIORITY_RANGE.contains(&body.priority) {
            return Err(FieldError::at("priority", "must be between -1000 and 1000"));
        }
        if body.cost == 0 || body.cost > limits::MAX_COST {
            return Err(FieldError::at(
                "cost",
                format_args!("must be between 1 and {} slots", limits::MAX_COST),
            ));
        }
        check_labels(&body.labels)?;
        if let Some(s) = &body.submitter {
            check_name("submitter", s)?;
        }
        Ok(ValidJob {
            submitter: body.submitter,
            job: NewJob {
                spec: body.spec,
                labels: body.labels,
                priority: body.priority,
                max_attempts: body.max_attempts,
                cost: body.cost,
                submitter: String::new(),
                parent_id: None,
                child_index: None,
                owner: None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: serde_json::Value) -> Result<ValidJob, FieldError> {
        let body: SubmitJob = serde_json::from_value(body).expect("a submission");
        ValidJob::try_from(body)
    }

    #[test]
    fn the_first_wrong_field_is_named() {
        for (body, field) in [
            (
                serde_json::json!({"kind": "command", "command": "  "}),
                "command",
            ),
            (
                serde_json::json!({"kind": "command", "command": "a\u{0}b"}),
                "command",
            ),
            (
                serde_json::json!({"kind": "command", "command": "true", "timeout_s": 0}),
                "timeout_s",
            ),
            (
                serde_json::json!({"kind": "command", "command": "true", "outputs": ["../x"]}),
                "outputs[0]",
            ),
            (
                serde_json::json!({"kind": "command", "command": "true", "max_attempts": 0}),
                "max_attempts",
            ),
            (
                serde_json::json!({"kind": "command", "command": "true", "cost": 0}),
                "cost",
            ),
            (
                serde_json::json!({"kind": "command", "command": "true",
                                   "env": {"A": "1"}, "secret_env": ["B"]}),
                "secret_env",
            ),
        ] {
            let e = check(body.clone())
                .err()
                .unwrap_or_else(|| panic!("{body} passed"));
            assert_eq!(e.field, field, "{body}: {e}");
        }
    }

    #[test]
    fn a_valid_job_keeps_what_was_asked_and_leaves_the_submitter_to_allow() {
        let v = check(serde_json::json!({
            "kind": "command", "command": "make test", "priority": 5,
            "max_attempts": 2, "cost": 3, "labels": {"gpu": "h100"}, "submitter": "ci"
        }))
        .expect("valid");
        assert_eq!(v.submitter.as_deref(), Some("ci"));
        assert_eq!((v.job.priority, v.job.max_attempts, v.job.cost), (5, 2, 3));
        assert_eq!(v.job.labels.get("gpu").map(String::as_str), Some("h100"));
        assert!(v.job.submitter.is_empty() && v.job.owner.is_none());
    }
}
