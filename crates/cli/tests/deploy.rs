//! The deployment kit under `deploy/` against the code it deploys: every metric the Grafana
//! dashboard queries is one `riptide serve` exports, the Dockerfile builds and runs what the
//! README says, the systemd unit runs the server from the config file inside a sandbox. (The
//! Dockerfile's lint and `systemd-analyze` run in `deploy/check`, from `.ci/run`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `riptide_…` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("riptide_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

#[test]
fn every_metric_the_dashboard_queries_is_exported() {
    // The names the server renders: its metrics module and the gauges the router adds.
    let exported: BTreeSet<String> = ["crates/serve/src/metrics.rs", "crates/serve/src/server.rs"]
        .iter()
        .flat_map(|f| metric_names(&read(f)))
        .collect();
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana-dashboard.json")).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8, "{} panels", panels.len());
    let mut queried = BTreeSet::new();
    for p in panels {
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} queries nothing", p["title"]);
        for t in targets {
            queried.extend(metric_names(t["expr"].as_str().unwrap()));
        }
    }
    assert!(queried.len() >= 20, "{queried:?}");
    for q in &queried {
        // A histogram is queried through its series.
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| q.strip_suffix(s))
            .filter(|b| exported.contains(*b))
            .unwrap_or(q);
        assert!(
            exported.contains(base),
            "the dashboard queries {q}, which riptide serve does not export"
        );
    }
    // The headline series are on it.
    for m in [
        "riptide_verdicts_total",
        "riptide_events_stored_total",
        "riptide_subscribers",
        "riptide_store_bytes",
        "riptide_upstream_idle_seconds",
        "riptide_resync_accounts",
        "riptide_resync_held_frames",
    ] {
        assert!(queried.contains(m), "the dashboard lacks {m}");
    }
}

#[test]
fn the_dockerfile_builds_in_one_stage_and_runs_unprivileged_in_another() {
    let text = read("deploy/Dockerfile");
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "multi-stage: {froms:?}");
    assert!(froms[0].ends_with(" AS build"), "{froms:?}");
    assert!(text.contains("cargo build --release --locked -p riptide-cli"));
    assert!(text.contains("COPY --from=build /out/riptide /usr/local/bin/riptide"));
    assert!(text.contains("USER 65532"), "not root");
    assert!(text.contains("EXPOSE 6008"));
    // It serves from the example config, which it copies where CMD looks.
    assert!(text.contains("COPY deploy/riptide.toml /etc/riptide/riptide.toml"));
    assert!(text.contains(r#"CMD ["serve", "--config", "/etc/riptide/riptide.toml"]"#));
    let config = read("deploy/riptide.toml");
    assert!(
        config.contains("listen = \"0.0.0.0:6008\""),
        "reachable from outside"
    );
    assert!(
        config.contains("data = \"/var/lib/riptide/data\""),
        "in the volume"
    );
    // The build context leaves out what it need not send.
    let ignore = read(".dockerignore");
    assert!(ignore.lines().any(|l| l == "target/"));
}

#[test]
fn the_systemd_unit_runs_the_config_in_a_sandbox() {
    let unit = read("deploy/riptide.service");
    let has = |line: &str| unit.lines().any(|l| l.trim() == line);
    assert!(has(
        "ExecStart=/usr/local/bin/riptide serve --config /etc/riptide/riptide.toml"
    ));
    for line in [
        "DynamicUser=yes",
        "StateDirectory=riptide",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "CapabilityBoundingSet=",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter=@system-service",
        "MemoryDenyWriteExecute=yes",
        "KillSignal=SIGTERM",
    ] {
        assert!(has(line), "deploy/riptide.service lacks {line}");
    }
}

#[test]
fn the_operator_docs_cover_health_readiness_and_disk() {
    let doc = read("deploy/README.md");
    for want in [
        "/healthz",
        "/readyz",
        "503",
        "Disk",
        "riptide_store_bytes",
        "--retention",
    ] {
        assert!(
            doc.contains(want),
            "deploy/README.md does not mention {want}"
        );
    }
}
