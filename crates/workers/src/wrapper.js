// kura's Durable Object wrapper (generated configuration, not user code). Each Durable Object
// class a deployed Worker exports is served as a subclass of itself that, before the object's
// first request, tells kura which object this is: kura then lists the object by name and
// captures its history. The announcement binding is taken out of the env the class sees.
const ANNOUNCE = "__KURA_DO";

export function announcing(UserClass, className) {
  if (typeof UserClass !== "function") {
    throw new Error(`Durable Object class '${className}' is not exported by the Worker's main module`);
  }
  const wrapped = class extends UserClass {
    constructor(ctx, env) {
      const announce = env?.[ANNOUNCE];
      let userEnv = env;
      if (announce !== undefined) {
        userEnv = { ...env };
        delete userEnv[ANNOUNCE];
      }
      super(ctx, userEnv);
      if (announce !== undefined) {
        const body = JSON.stringify({ class: className, id: ctx.id.toString(), name: ctx.id.name ?? null });
        ctx.blockConcurrencyWhile(async () => {
          const response = await announce.fetch("http://kura/objects", { method: "POST", body });
          if (!response.ok) {
            throw new Error(`kura did not accept the object: ${response.status} ${await response.text()}`);
          }
        });
      }
    }
  };
  Object.defineProperty(wrapped, "name", { value: UserClass.name });
  return wrapped;
}
