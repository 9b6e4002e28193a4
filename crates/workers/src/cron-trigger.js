// kura's handler trigger (generated configuration, not user code): kura asks it to run a
// Worker's `scheduled` handler (`POST /`) or its `queue` handler with a batch (`POST /queue`),
// through a service binding and workerd's `Fetcher.scheduled()` and `Fetcher.queue()`.

function decode(base64) {
  const bytes = atob(base64);
  const out = new Uint8Array(bytes.length);
  for (let i = 0; i < bytes.length; i++) out[i] = bytes.charCodeAt(i);
  return out;
}

// A stored message as the consumer sees it: text and JSON decoded, bytes as an ArrayBuffer,
// V8-serialized bodies handed to workerd to deserialize.
function message({ id, timestamp, attempts, contentType, body }) {
  const bytes = decode(body);
  const common = { id, timestamp: new Date(timestamp), attempts };
  switch (contentType) {
    case "text":
      return { ...common, body: new TextDecoder().decode(bytes) };
    case "json":
      return { ...common, body: JSON.parse(new TextDecoder().decode(bytes)) };
    case "bytes":
      return { ...common, body: bytes.buffer };
    default:
      return { ...common, serializedBody: bytes };
  }
}

export default {
  async fetch(request, env) {
    if (new URL(request.url).pathname === "/queue") {
      const { queue, messages, metrics } = await request.json();
      const result = await env.TARGET.queue(queue, messages.map(message), {
        metrics: {
          backlogCount: metrics.backlogCount,
          backlogBytes: metrics.backlogBytes,
          oldestMessageTimestamp: metrics.oldestMessageTimestamp ? new Date(metrics.oldestMessageTimestamp) : undefined,
        },
      });
      return Response.json({
        outcome: result.outcome,
        ackAll: result.ackAll,
        retryBatch: result.retryBatch,
        explicitAcks: result.explicitAcks,
        retryMessages: result.retryMessages,
      });
    }
    const { cron, scheduledTime } = await request.json();
    const result = await env.TARGET.scheduled({ cron, scheduledTime: new Date(scheduledTime) });
    return Response.json({ outcome: result.outcome, noRetry: result.noRetry });
  },
};
