//! The demo's race page and the operations page, in a real browser: headless Chromium driven
//! through chromedriver (WebDriver, fantoccini). The chaos race must show seats sold twice and
//! an oversell above 0, the clean race (the real engine) 0 oversold with every seat sold once,
//! and `/ops` figures that move while a sale runs. Screenshots go to
//! `target/tmp/screenshots/` (`CARGO_TARGET_TMPDIR`).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them). Without them the
//! test says so and is skipped, unless `BOXOFFICE_REQUIRE_BROWSER=1` (CI), where it fails.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};

fn find_tool(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in names {
        for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/bin")]) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// chromedriver and the browser, or `None` (after saying why) where the test may be skipped.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let driver = find_tool(&["chromedriver"]);
    let chromium = find_tool(&["chromium", "chromium-browser", "google-chrome"]);
    match (driver, chromium) {
        (Some(d), Some(c)) => Some((d, c)),
        _ => {
            let msg = "the browser test needs chromium and chromedriver (apt-get install chromium chromium-driver)";
            boxoffice_engine::tiers::skip_unless_required("browser", msg);
            None
        }
    }
}

/// chromedriver on a free loopback port, killed on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_driver(path: &Path) -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(path)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver { child, port };
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return driver;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("chromedriver did not listen on {port} within 10 s");
}

async fn session(driver: &Driver, chromium: &Path, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium.to_string_lossy(),
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a browser session")
}

async fn text(c: &Client, id: &str) -> String {
    c.find(Locator::Id(id)).await.unwrap().text().await.unwrap()
}

async fn number(c: &Client, id: &str) -> u64 {
    let t = text(c, id).await.replace([',', '.', '\u{a0}'], "");
    t.parse()
        .unwrap_or_else(|_| panic!("#{id} shows a number, not {t:?}"))
}

/// Waits (60 s at most) until `#id` shows `want`.
async fn until_text(c: &Client, id: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if text(c, id).await == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "#{id} did not show {want:?} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Clicks the page's button for `mode` and waits until that race is done.
async fn run_race(c: &Client, mode: &str) {
    c.find(Locator::Id(&format!("run-{mode}")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_text(c, "state", "done").await;
    assert_eq!(text(c, "mode").await, mode);
}

async fn set_input(c: &Client, id: &str, value: &str) {
    let e = c.find(Locator::Id(id)).await.unwrap();
    e.clear().await.unwrap();
    e.send_keys(value).await.unwrap();
}

fn save(name: &str, png: &[u8]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_race_page_shows_chaos_overselling_and_the_engine_selling_each_seat_once() {
    let Some((driver_path, chromium)) = browser() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let demo = boxoffice_drill::demo::start("127.0.0.1:0".parse().unwrap(), data.path().into())
        .await
        .unwrap();
    let base = format!("http://{}", demo.http);
    let driver = start_driver(&driver_path).await;
    let profile = tempfile::tempdir().unwrap();
    let c = session(&driver, &chromium, profile.path()).await;

    c.goto(&format!("{base}/")).await.unwrap();
    assert_eq!(c.title().await.unwrap(), "boxoffice: the race of the dots");
    set_input(&c, "fans", "100").await;
    set_input(&c, "seats", "10").await;
    set_input(&c, "speed", "4").await;

    // Chaos: seats sold twice, an oversell.
    run_race(&c, "chaos").await;
    let oversold = number(&c, "oversold").await;
    let double = number(&c, "double").await;
    assert!(oversold > 0, "chaos oversells: {oversold}");
    assert!(double > 0, "chaos sells seats twice: {double}");
    let twice = c.find_all(Locator::Css(".seat.twice")).await.unwrap();
    assert_eq!(
        twice.len() as u64,
        double,
        "the page marks each seat sold twice"
    );
    save("demo-chaos.png", &c.screenshot().await.unwrap());

    // Clean: the real engine, every seat once.
    run_race(&c, "clean").await;
    assert_eq!(number(&c, "oversold").await, 0);
    assert_eq!(number(&c, "double").await, 0);
    assert_eq!(number(&c, "sold").await, 10, "every seat sold");
    assert_eq!(
        number(&c, "refused").await,
        90,
        "the other 90 fans got no seat"
    );
    assert!(
        c.find_all(Locator::Css(".seat.twice"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        c.find_all(Locator::Css(".seat.taken")).await.unwrap().len(),
        10
    );
    let checked = text(&c, "checked").await;
    assert!(
        checked.contains("10 held or sold, 0 available of 10 (as many as the fans were told)"),
        "{checked}"
    );
    save("demo-clean.png", &c.screenshot().await.unwrap());

    // /ops: the figures move while a sale runs.
    c.goto(&format!("{base}/ops")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while number(&c, "polls").await < 2 {
        assert!(Instant::now() < deadline, "/ops polled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The figures are this process's (the metrics recorder is global: other tests' servers in
    // this binary add to them), so they are compared with themselves, not with totals.
    let before = number(&c, "holds-total").await;
    assert!(before >= 10, "the clean race's holds are counted: {before}");
    let (tx, mut rx) = tokio::sync::mpsc::channel(4_096);
    let race = tokio::spawn(boxoffice_drill::demo::race::clean(
        boxoffice_drill::demo::Race {
            fans: 200,
            seats: 60,
            speed: 2.0,
        },
        demo.target.clone(),
        99,
        tx,
    ));
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = number(&c, "holds-total").await;
        if now > before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/ops's holds did not move within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    race.await.unwrap();
    drain.await.unwrap();
    // A poll after the race shows its section with its seats gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = c
            .find_all(Locator::Css("tr.section[data-section='front']"))
            .await
            .unwrap();
        if rows.len() >= 2 && number(&c, "holds-total").await >= before + 60 {
            break;
        }
        assert!(Instant::now() < deadline, "/ops shows both races' sections");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(text(&c, "store").await, "ok");
    // Charts of the last 10 minutes, drawn in the page: the expiry lag, and four an event.
    let charts = c
        .find_all(Locator::Css("svg.chart polyline"))
        .await
        .unwrap();
    assert!(charts.len() >= 5, "{} chart lines", charts.len());
    // Sale controls: hidden without a key; with the admin key, a pause shows in the next poll,
    // and a resume after it.
    // The race above (run 99) made event race-99 on the demo's server (the page lists every
    // event of this process's metrics: other tests' servers' too).
    let event = c
        .find(Locator::Css("section.event[data-event='race-99']"))
        .await
        .unwrap();
    let controls = event.find(Locator::Css(".controls")).await.unwrap();
    assert!(
        !controls.is_displayed().await.unwrap(),
        "no key, no controls"
    );
    c.find(Locator::Id("admin-key"))
        .await
        .unwrap()
        .send_keys(&demo.target.admin_key)
        .await
        .unwrap();
    c.find(Locator::Id("use-key"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(
        controls.is_displayed().await.unwrap(),
        "controls with a key"
    );
    for (button, state) in [("sale-pause", "PAUSED"), ("sale-resume", "OPEN")] {
        event
            .find(Locator::Css(&format!("button.{button}")))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sale = event.find(Locator::Css(".sale")).await.unwrap();
            if sale.attr("data-sale").await.unwrap().as_deref() == Some(state) {
                break;
            }
            let answer = event.find(Locator::Css(".answer")).await.unwrap();
            assert!(
                Instant::now() < deadline,
                "/ops did not show the sale {state}: {} (the control's answer: {})",
                sale.text().await.unwrap(),
                answer.text().await.unwrap()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    save("ops.png", &c.screenshot().await.unwrap());
    c.close().await.unwrap();
    demo.running.shutdown().await.unwrap();
}
