//! JavaScript Durable Objects on a cluster's node: the calls stubs make through kura (see
//! `objects-stub.js`) reach the namespace's serving node, which makes them on the object
//! through its workerd's door to the class (`objects-door.js`). Only that node's workerd ever
//! runs the namespace's objects.

use axum::body::Body;
use axum::http::{Request, Response, Uri};

use crate::Workers;
use crate::config::objects_door;
use crate::error::{Result, WorkersError};
use crate::proxy::PassBody;

impl Workers {
    /// Sends a stub's call to the door of `script_id`'s objects in this node's workerd, through
    /// the gate: it waits while workerd is stopped, and the answer streams back holding its
    /// pass. A call passes a gate that is closing (see [`crate::gate::Gate::join`]): a Worker's
    /// request waits on it — on this node, or on another whose Worker's call was itself made
    /// from an object here — and the closing waits for that request.
    pub async fn call_door(&self, script_id: &str, mut request: Request<Body>) -> Result<Response<Body>> {
        let door = objects_door(script_id);
        let runtime = self
            .inner
            .runtime
            .get()
            .ok_or_else(|| WorkersError::Unavailable("workerd is not running here yet; retry shortly".into()))?;
        let (pass, _) = runtime
            .enter(&door, true)
            .await
            .ok_or_else(|| WorkersError::Unavailable("workerd is restarting; retry shortly".into()))?;
        *request.uri_mut() = format!("http://{door}/")
            .parse::<Uri>()
            .map_err(|e| WorkersError::Runtime(format!("the door's address: {e}")))?;
        let response =
            self.upstream().request(request).await.map_err(|e| {
                WorkersError::Runtime(format!("the object's class could not be reached in workerd: {e}"))
            })?;
        let (parts, body) = response.into_parts();
        Ok(Response::from_parts(parts, Body::new(PassBody { body, _pass: pass })))
    }
}
