//! A small HTTP/1.1 client of a test server's HTTP API (hyper's), with JSON bodies.

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// An answer: status, headers, body.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "the body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// A header's value as text ("" if absent).
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }

    /// The problem's `reason` ("" without one), checking the answer is a problem.
    pub fn reason(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            "application/problem+json",
            "{} is a problem: {}",
            self.status,
            String::from_utf8_lossy(&self.body)
        );
        self.json()["reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// A client of one server, with one API key.
#[derive(Clone)]
pub struct Http {
    base: String,
    key: Option<String>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Http {
    /// A client of the HTTP API at `addr`, sending `key` as `Authorization: Bearer`.
    pub fn new(addr: std::net::SocketAddr, key: Option<&str>) -> Http {
        Http {
            base: format!("http://{addr}"),
            key: key.map(str::to_owned),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Sends `method path` with `headers` and `body` (raw bytes).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Answer {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(k) = &self.key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body))).expect("a request");
        let res = self.client.request(req).await.expect("the server answers");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("a body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// `GET path` with `headers`.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        self.send(Method::GET, path, headers, Vec::new()).await
    }

    /// `POST path` with a JSON body and `headers`.
    pub async fn post(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> Answer {
        self.send(
            Method::POST,
            path,
            headers,
            serde_json::to_vec(body).expect("JSON"),
        )
        .await
    }
}
