//! The contract's list calls as a cluster answers them from every group at once: each group is
//! asked for a page ([`Listing::of_group`]) and the pages are merged into the page one group
//! would have answered ([`Listing::merge`]). `ListEvents` (in event id order) and `ListOrders`
//! without an event (newest first, its next page token signed again by the merging node). Both
//! faces use it: the gRPC face in [`crate::node::forward`], the HTTP face in [`crate::local`].
//! Data and pure rules only: no IO.

use boxoffice_proto::v1 as pb;

use crate::limits::{LIST_PAGE_DEFAULT, LIST_PAGE_MAX, ORDERS_PAGE_DEFAULT, ORDERS_PAGE_MAX};
use crate::tokens::{OrdersPageToken, TokenSigner};

/// A list call answered by every group (see the module).
pub trait Listing: prost::Message + Default + Clone + Send + 'static {
    /// Its answer: a page.
    type Page: prost::Message + Default + Send + 'static;
    /// The RPC's gRPC path.
    const LIST_PATH: &'static str;
    /// The request each group is asked.
    fn of_group(&self) -> Self;
    /// The groups' pages merged into one page of the size asked, as one group would answer;
    /// `signer` signs a page token that must be signed.
    fn merge(&self, pages: Vec<Self::Page>, signer: &TokenSigner) -> Self::Page;
}

/// The page size a `ListEvents` asks for: 0 is the default, more than the most is the most.
pub fn events_page_size(asked: &pb::ListEventsRequest) -> usize {
    match asked.page_size as usize {
        0 => LIST_PAGE_DEFAULT,
        n => n.min(LIST_PAGE_MAX),
    }
}

/// The `next_page_token` of a `ListEvents` page: its last event id if `more` follow, else empty.
pub fn next_events_token(page: &[pb::Event], more: bool) -> String {
    if more {
        page.last().map(|e| e.event_id.clone()).unwrap_or_default()
    } else {
        String::new()
    }
}

impl Listing for pb::ListEventsRequest {
    type Page = pb::ListEventsResponse;
    const LIST_PATH: &'static str = "/boxoffice.v1.EventService/ListEvents";

    fn of_group(&self) -> Self {
        pb::ListEventsRequest {
            page_size: u32::try_from(events_page_size(self)).unwrap_or(u32::MAX),
            page_token: self.page_token.clone(),
        }
    }

    fn merge(&self, pages: Vec<Self::Page>, _: &TokenSigner) -> Self::Page {
        let size = events_page_size(self);
        let mut more = false;
        let mut events = Vec::new();
        for page in pages {
            more |= !page.next_page_token.is_empty();
            events.extend(page.events);
        }
        events.sort_by(|a, b| a.event_id.cmp(&b.event_id));
        if events.len() > size {
            more = true;
            events.truncate(size);
        }
        let next_page_token = next_events_token(&events, more);
        pb::ListEventsResponse {
            events,
            next_page_token,
        }
    }
}

/// The page size a `ListOrders` asks for: 0 is the default, more than the most is the most.
pub fn orders_page_size(asked: &pb::ListOrdersRequest) -> usize {
    match asked.page_size as usize {
        0 => ORDERS_PAGE_DEFAULT,
        n => n.min(ORDERS_PAGE_MAX),
    }
}

/// The `next_page_token` of a `ListOrders` page of `asked`: the last order shown, signed for the
/// same user and event, if `more` follow; else empty.
pub fn next_orders_token(
    asked: &pb::ListOrdersRequest,
    page: &[pb::Order],
    more: bool,
    signer: &TokenSigner,
) -> String {
    match page.last() {
        Some(last) if more => signer.sign_orders_page(&OrdersPageToken {
            user_id: asked.user_id.clone(),
            event_id: asked.event_id.clone(),
            created_at_ms: u64::try_from(last.created_at_unix_ms).unwrap_or(0),
            order_id: last.order_id.clone(),
        }),
        _ => String::new(),
    }
}

/// Newest first: by creation time, then by order id, both descending (the engine's order).
fn newest_first(a: &pb::Order, b: &pb::Order) -> std::cmp::Ordering {
    (b.created_at_unix_ms, &b.order_id).cmp(&(a.created_at_unix_ms, &a.order_id))
}

impl Listing for pb::ListOrdersRequest {
    type Page = pb::ListOrdersResponse;
    const LIST_PATH: &'static str = "/boxoffice.v1.BookingService/ListOrders";

    fn of_group(&self) -> Self {
        self.clone()
    }

    fn merge(&self, pages: Vec<Self::Page>, signer: &TokenSigner) -> Self::Page {
        let size = orders_page_size(self);
        let mut more = false;
        let mut orders = Vec::new();
        for page in pages {
            more |= !page.next_page_token.is_empty();
            orders.extend(page.orders);
        }
        orders.sort_by(newest_first);
        if orders.len() > size {
            more = true;
            orders.truncate(size);
        }
        let next_page_token = next_orders_token(self, &orders, more, signer);
        pb::ListOrdersResponse {
            orders,
            next_page_token,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn order(id: &str, at: i64) -> pb::Order {
        pb::Order {
            order_id: id.into(),
            created_at_unix_ms: at,
            ..Default::default()
        }
    }

    #[test]
    fn orders_of_every_group_merge_newest_first_into_one_page_of_the_size_asked() {
        let signer = TokenSigner::new(b"secret");
        let asked = pb::ListOrdersRequest {
            user_id: "ann".into(),
            page_size: 3,
            ..Default::default()
        };
        let pages = vec![
            pb::ListOrdersResponse {
                orders: vec![order("a.s.o2", 20), order("a.s.o1", 10)],
                next_page_token: String::new(),
            },
            pb::ListOrdersResponse {
                orders: vec![order("b.s.o3", 20), order("b.s.o4", 5)],
                next_page_token: String::new(),
            },
        ];
        let page = asked.merge(pages, &signer);
        let ids: Vec<&str> = page.orders.iter().map(|o| o.order_id.as_str()).collect();
        assert_eq!(ids, ["b.s.o3", "a.s.o2", "a.s.o1"]);
        let token = signer
            .verify_orders_page(&page.next_page_token, "ann", "")
            .expect("a token for the same listing");
        assert_eq!(
            (token.created_at_ms, token.order_id.as_str()),
            (10, "a.s.o1")
        );
        // Everything fits: no token.
        let all = pb::ListOrdersRequest {
            page_size: 4,
            ..asked.clone()
        }
        .merge(
            vec![pb::ListOrdersResponse {
                orders: vec![order("a.s.o2", 20)],
                next_page_token: String::new(),
            }],
            &signer,
        );
        assert!(all.next_page_token.is_empty());
        // A group with more to show: a token even when the merged page is short.
        let more = asked.merge(
            vec![pb::ListOrdersResponse {
                orders: vec![order("a.s.o2", 20)],
                next_page_token: "x".into(),
            }],
            &signer,
        );
        assert!(!more.next_page_token.is_empty());
    }

    #[test]
    fn page_sizes_default_and_cap() {
        let asked = |n| pb::ListOrdersRequest {
            page_size: n,
            ..Default::default()
        };
        assert_eq!(orders_page_size(&asked(0)), ORDERS_PAGE_DEFAULT);
        assert_eq!(orders_page_size(&asked(7)), 7);
        assert_eq!(orders_page_size(&asked(100_000)), ORDERS_PAGE_MAX);
    }
}
